"""Env registry: `env.name` -> a factory of (`new_env()`, the TaskSource of the configured split), where `new_env`
builds an Env with its settings from the env's config section (`env.<name>`)."""
import time

from lopd_ray.envs.base import Env, StepResult, Task, TaskSource
from lopd_ray.envs.letters import make_letters
from lopd_ray.envs.referenced import with_referenced_kinds
from lopd_ray.envs.rules import make_rules
from lopd_ray.envs.rules_tool import make_rules_tool


def make_bfcl_multiturn(env_cfg):
    from lopd_ray.envs.bfcl import make_bfcl_multiturn as make  # imports the bfcl-eval simulators

    return make(env_cfg)


def make_envscaler(env_cfg):
    from lopd_ray.envs.envscaler import make_envscaler as make

    return make(env_cfg)


def make_code(env_cfg):
    from lopd_ray.envs.code import make_code as make  # the sandbox and the benchmark loaders

    return make(env_cfg)


ENVS = {"letters": make_letters, "rules": with_referenced_kinds(make_rules),
        "rules_tool": with_referenced_kinds(make_rules_tool),
        "bfcl_multiturn": make_bfcl_multiturn, "envscaler": make_envscaler, "code": make_code}

# Keys of the `env` section that make_env reads for every env.
EVERY_ENV_READS = ("env.name", "env.step_latency_s")
# The other keys of the `env` section (besides its own `env.<name>`) that each env reads: one set for an env that
# does not read it is a config error (preflight.check_unread_keys). letters has one size, env.letters.num_tasks;
# BFCL has no split.
ENV_KEYS_READ = {
    "letters": ("env.split",),
    "rules": ("env.split", "env.limit"),
    "rules_tool": ("env.split", "env.limit"),
    "bfcl_multiturn": ("env.limit", "env.data_dir"),
    "envscaler": ("env.split", "env.limit", "env.data_dir"),
    "code": ("env.split", "env.limit", "env.data_dir"),
}


class Delayed(Env):
    """`env` whose every step first waits `latency_s` (env.step_latency_s)."""

    def __init__(self, env: Env, latency_s: float):
        super().__init__(env.max_turns)
        self.env, self.latency_s = env, latency_s

    def reset(self, task: Task) -> None:
        self.env.reset(task)

    def step(self, action_text: str) -> StepResult:
        time.sleep(self.latency_s)
        return self.env.step(action_text)

    def syntax_mask(self, action_text: str):
        return self.env.syntax_mask(action_text)


def make_env(env_cfg):
    new_env, tasks = ENVS[env_cfg.name](env_cfg)
    if env_cfg.step_latency_s > 0:
        return (lambda: Delayed(new_env(), env_cfg.step_latency_s)), tasks
    return new_env, tasks


__all__ = ["ENVS", "ENV_KEYS_READ", "EVERY_ENV_READS", "Env", "StepResult", "Task", "TaskSource", "make_env"]
