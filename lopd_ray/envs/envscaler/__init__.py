"""EnvScaler-format programmatic tool-use environments: stateful Python environments with tools, scenarios with
state checklists (reward = fraction passed). EnvScaler's released JSON is read when present (loader.py);
otherwise a generated suite of 20 domains (suite.py) stands in."""
from lopd_ray.envs.envscaler.core import Catalog, EnvSpec, OracleCall, Scenario, StateCheck, ToolRuntime
from lopd_ray.envs.envscaler.env import EnvScalerEnv, EnvScalerTasks, make_envscaler, parse_calls
from lopd_ray.envs.envscaler.loader import export_catalog, load_catalog, load_json
from lopd_ray.envs.envscaler.suite import build_suite

__all__ = ["Catalog", "EnvScalerEnv", "EnvScalerTasks", "EnvSpec", "OracleCall", "Scenario", "StateCheck",
           "ToolRuntime", "build_suite", "export_catalog", "load_catalog", "load_json", "make_envscaler",
           "parse_calls"]
