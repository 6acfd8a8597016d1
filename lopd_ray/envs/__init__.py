"""Env registry: `env.name` -> the EnvSpec that builds the env and the TaskSource of the configured split. `env.name`
is a registered name or, for an env of the user's own, an import path `module:ATTRIBUTE` naming an EnvSpec."""
import importlib
import time

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lopd_ray.envs.base import Env, EnvSpec, StepResult, Task, TaskList, TaskSource
from lopd_ray.envs.letters import make_letters
from lopd_ray.envs.referenced import with_referenced_kinds
from lopd_ray.envs.rules import make_rules
from lopd_ray.envs.rules_tool import make_rules_tool
from lopd_ray.errors import ConfigError


def make_bfcl_multiturn(env_cfg, own):
    from lopd_ray.envs.bfcl import make_bfcl_multiturn as make  # imports the bfcl-eval simulators

    return make(env_cfg, own)


def make_envscaler(env_cfg, own):
    from lopd_ray.envs.envscaler import make_envscaler as make

    return make(env_cfg, own)


def make_code(env_cfg, own):
    from lopd_ray.envs.code import make_code as make  # the sandbox and the benchmark loaders

    return make(env_cfg, own)


# The registry's envs read their own section `env.<name>` of the config schema. letters has one size,
# env.letters.num_tasks; BFCL has no split.
ENVS = {
    "letters": EnvSpec(make_letters, reads=("env.split",)),
    "rules": EnvSpec(with_referenced_kinds(make_rules), reads=("env.split", "env.limit")),
    "rules_tool": EnvSpec(with_referenced_kinds(make_rules_tool), reads=("env.split", "env.limit")),
    "bfcl_multiturn": EnvSpec(make_bfcl_multiturn, reads=("env.limit", "env.data_dir")),
    "envscaler": EnvSpec(make_envscaler, reads=("env.split", "env.limit", "env.data_dir")),
    "code": EnvSpec(make_code, reads=("env.split", "env.limit", "env.data_dir")),
}

# Keys of the `env` section that make_env reads for every env.
EVERY_ENV_READS = ("env.name", "env.step_latency_s")


def env_spec(name: str) -> EnvSpec:
    """The registered env `name`, or the EnvSpec that the import path `module:ATTRIBUTE` names."""
    if name in ENVS:
        return ENVS[name]
    module_name, colon, attribute = name.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(f"env.name='{name}' is not registered: choose one of {sorted(ENVS)}, or name an env of "
                          f"your own as module:ATTRIBUTE (e.g. my_tasks.reverse:ENV, docs/envs.md)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module exists and one of its own imports is missing: its traceback says which
        raise ConfigError(f"env.name={name}: no module '{module_name}' is importable from here: run from the "
                          f"folder that holds it, or add that folder to PYTHONPATH") from None
    spec = getattr(module, attribute, None)
    if not isinstance(spec, EnvSpec):
        found = f"has no {attribute}" if spec is None else f"has a {type(spec).__name__} as {attribute}"
        raise ConfigError(f"env.name={name}: {module_name} {found}, not an EnvSpec: define {attribute} = "
                          f"EnvSpec(make, options=..., reads=...) there (docs/envs.md)")
    return spec


def env_options(env_cfg, spec: EnvSpec):
    """The env's own settings: the schema's section `env.<name>` for a registered env, `env.options` read into
    the spec's options dataclass for an env named by import path."""
    if env_cfg.name in ENVS:
        if env_cfg.options:
            raise ConfigError(f"env.options.{next(iter(env_cfg.options))} is never read by env.name={env_cfg.name}: "
                              f"its settings are env.{env_cfg.name}.* (env.options is for an env named by import "
                              f"path)")
        return getattr(env_cfg, env_cfg.name, None)
    if spec.options is None:
        if env_cfg.options:
            raise ConfigError(f"env.options.{next(iter(env_cfg.options))}: env.name={env_cfg.name} declares no "
                              f"options (its EnvSpec has options=None): remove it")
        return None
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(spec.options), dict(env_cfg.options)))
    except OmegaConfBaseException as exc:
        fields = ", ".join(f.name for f in spec.options.__dataclass_fields__.values())
        raise ConfigError(f"env.options.{getattr(exc, 'full_key', None) or '?'}: {str(exc).splitlines()[0]}; "
                          f"env.name={env_cfg.name} takes {spec.options.__name__}'s fields: {fields}") from None


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
    spec = env_spec(env_cfg.name)
    new_env, tasks = spec.make(env_cfg, env_options(env_cfg, spec))
    if env_cfg.step_latency_s > 0:
        return (lambda: Delayed(new_env(), env_cfg.step_latency_s)), tasks
    return new_env, tasks


__all__ = ["ENVS", "EVERY_ENV_READS", "Env", "EnvSpec", "StepResult", "Task", "TaskList", "TaskSource", "env_options",
           "env_spec", "make_env"]
