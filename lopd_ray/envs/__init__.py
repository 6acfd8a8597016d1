"""Env registry: `env.name` -> a factory of (`new_env()`, the TaskSource of the configured split), where `new_env`
builds an Env with its settings from the env's config section (`env.<name>`)."""
from lopd_ray.envs.base import Env, StepResult, Task, TaskSource
from lopd_ray.envs.letters import make_letters


def make_bfcl_multiturn(env_cfg):
    from lopd_ray.envs.bfcl import make_bfcl_multiturn as make  # imports the bfcl-eval simulators

    return make(env_cfg)


def make_envscaler(env_cfg):
    from lopd_ray.envs.envscaler import make_envscaler as make

    return make(env_cfg)


def make_code(env_cfg):
    from lopd_ray.envs.code import make_code as make  # the sandbox and the benchmark loaders

    return make(env_cfg)


ENVS = {"letters": make_letters, "bfcl_multiturn": make_bfcl_multiturn, "envscaler": make_envscaler,
        "code": make_code}


def make_env(env_cfg):
    return ENVS[env_cfg.name](env_cfg)


__all__ = ["ENVS", "Env", "StepResult", "Task", "TaskSource", "make_env"]
