"""Reading and writing EnvScaler's JSON; without data on disk, the generated suite.

Assumed layout (EnvScaler's released files, as read by its RL code `EnvScalerBaseEnv` and written by its
`scen_generator`), under `<data_dir>/envscaler/`:

  env_metadata.json (or EnvScaler's names 191_env_metadata.json / filtered_env_metadata.json): a list of
    {"env_id": int | str (optional; default: the position in the list),
     "env_name": str (optional, this project: the name `env.envscaler.subset` uses; default: env_class_name),
     "env_class_name": str,
     "environment_introduction": str,
     "constraints_rules": [str, ...],
     "tools": [{"type": "function", "function": {"name", "description", "parameters": JSON schema}}, ...],
     "env_class_code": str   (EnvScaler: Python source defining env_class_name), or
     "env_class_path": str   (this project: "module:Class" of an importable class)}

  scenarios.json (or envscaler_rl_scenario_metadata.json / env_scenario.json): a list of
    {"task_id": str,
     "env_id": int | str (an index into the environment list, or an env item's "env_id"),
     "env_class_name": str,
     "init_config": {attribute: value, ...},
     "task": str,
     "checklist_with_func": [{"check_item": str,
                              "check_func": "def check_func(final_state): ...",   (may read `initial_state`)
                              "check": {"op", "path", "value"}   (optional, this project: a declarative check,
                                                                  used instead of the code when present)}, ...],
     "oracle": [{"name": str, "arguments": {...}}, ...]   (optional, this project)}

Instances are built as EnvScaler does: `cls(init_config)` (or `cls()`), then every init_config key set as an
attribute. `env_class_code` and `check_func` are executed: they come from the dataset file, which you trust as
you trust installed code. The agent's text is never executed or evaluated.
"""
from __future__ import annotations

import copy
import functools
import importlib
import json
import types
from pathlib import Path
from typing import Any, Optional

from lopd_ray.envs.data import locate_data_root
from lopd_ray.envs.envscaler.core import (
    Catalog,
    Check,
    CodeCheck,
    EnvSpec,
    OracleCall,
    Scenario,
    StateCheck,
    state_check_code,
)

ENV_FILES = ("env_metadata.json", "191_env_metadata.json", "filtered_env_metadata.json")
SCENARIO_FILES = ("scenarios.json", "envscaler_rl_scenario_metadata.json", "env_scenario.json")


def _first(folder: Path, names: tuple[str, ...]) -> Optional[Path]:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def load_catalog(data_dir: Optional[str]) -> Catalog:
    """EnvScaler JSON under <root>/envscaler when both files are there, else the generated suite."""
    folder = locate_data_root(data_dir)[0] / "envscaler"
    env_file, scenario_file = _first(folder, ENV_FILES), _first(folder, SCENARIO_FILES)
    if env_file and scenario_file:
        return load_json(env_file, scenario_file)
    if env_file or scenario_file:
        raise ValueError(f"{folder} holds only {(env_file or scenario_file).name}: EnvScaler data needs one of "
                         f"{ENV_FILES} and one of {SCENARIO_FILES}")
    from lopd_ray.envs.envscaler.suite import build_suite

    return build_suite()


def instantiate(cls: type, init_config: dict[str, Any]) -> Any:
    """EnvScaler's `init_env_instance`."""
    init_config = copy.deepcopy(init_config)
    try:
        instance = cls(init_config)
    except TypeError:
        instance = cls()
    for key, value in init_config.items():
        setattr(instance, key, value)
    return instance


def _env_class(item: dict[str, Any]) -> type:
    if "env_class_path" in item:
        module, _, name = item["env_class_path"].partition(":")
        return getattr(importlib.import_module(module), name)
    module = types.ModuleType(f"envscaler_{item['env_class_name']}")
    exec(compile(item["env_class_code"], f"<envscaler {item['env_class_name']}>", "exec"), module.__dict__)
    return getattr(module, item["env_class_name"])


def _env_spec(item: dict[str, Any], name: str) -> EnvSpec:
    cls = _env_class(item)
    return EnvSpec(name=name, introduction=item.get("environment_introduction", ""),
                   rules=list(item.get("constraints_rules", [])), tools=item["tools"],
                   factory=functools.partial(instantiate, cls), class_name=item["env_class_name"],
                   class_path=item.get("env_class_path"), class_code=item.get("env_class_code"))


def _check(item: dict[str, Any]) -> Check:
    description = item.get("check_item", "")
    if "check" in item:
        return StateCheck.from_json(item["check"], description)
    return CodeCheck(description, item["check_func"])


def load_json(env_file: Path, scenario_file: Path) -> Catalog:
    env_items = json.loads(Path(env_file).read_text(encoding="utf-8"))
    scenario_items = json.loads(Path(scenario_file).read_text(encoding="utf-8"))
    envs: dict[str, EnvSpec] = {}
    by_id: dict[Any, str] = {}
    for position, item in enumerate(env_items):
        name = item.get("env_name") or item["env_class_name"]
        if name in envs:
            name = f"{name}_{item.get('env_id', position)}"
        envs[name] = _env_spec(item, name)
        by_id[position] = by_id[str(item.get("env_id", position))] = name
    scenarios = []
    for item in scenario_items:
        env_id = item["env_id"]
        name = by_id.get(env_id if isinstance(env_id, int) else str(env_id))
        if name is None:
            raise ValueError(f"{scenario_file}: scenario {item['task_id']} names env_id {env_id!r}, which "
                             f"{env_file} does not define")
        if not item.get("checklist_with_func"):
            raise ValueError(f"{scenario_file}: scenario {item['task_id']} has no checklist_with_func")
        scenarios.append(Scenario(scenario_id=str(item["task_id"]), env_name=name, task=item["task"],
                                  init_config=item.get("init_config") or {},
                                  checks=[_check(c) for c in item["checklist_with_func"]],
                                  oracle=[OracleCall(c["name"], c["arguments"]) for c in item.get("oracle", [])]))
    return Catalog(envs, scenarios, origin=f"json:{scenario_file}")


def _check_item(check: Check) -> dict[str, Any]:
    if isinstance(check, StateCheck):
        return {"check_item": check.description, "check_func": state_check_code(check), "check": check.to_json()}
    return {"check_item": check.description, "check_func": check.code}


def export_catalog(catalog: Catalog, folder: str) -> tuple[Path, Path]:
    """Writes `catalog` in the layout above (folder/env_metadata.json, folder/scenarios.json)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    env_items = []
    for name, spec in catalog.envs.items():
        item = {"env_id": name, "env_name": name, "env_class_name": spec.class_name,
                "environment_introduction": spec.introduction, "constraints_rules": spec.rules, "tools": spec.tools}
        item.update({"env_class_path": spec.class_path} if spec.class_path else {"env_class_code": spec.class_code})
        env_items.append(item)
    scenario_items = [{"task_id": s.scenario_id, "env_id": s.env_name, "env_class_name": catalog.envs[s.env_name]
                       .class_name, "init_config": s.init_config, "task": s.task,
                       "checklist": [c.description for c in s.checks],
                       "checklist_with_func": [_check_item(c) for c in s.checks],
                       "oracle": [{"name": c.name, "arguments": c.arguments} for c in s.oracle]}
                      for s in catalog.scenarios]
    env_file, scenario_file = out / ENV_FILES[0], out / SCENARIO_FILES[0]
    env_file.write_text(json.dumps(env_items, indent=1), encoding="utf-8")
    scenario_file.write_text(json.dumps(scenario_items, indent=1), encoding="utf-8")
    return env_file, scenario_file
