"""The generated suite: EnvScaler-format environments written for this project (EnvScaler's own 191 are not
available offline). Each domain module defines one stateful environment class and its task kinds; scenario i of
a domain is generated from the seed "envscaler/<domain>/<i>", so the suite is identical on every machine.
"""
from __future__ import annotations

import importlib

from lopd_ray.envs.envscaler.core import Catalog, EnvSpec, Scenario, tool_specs
from lopd_ray.envs.envscaler.domains.kit import Domain, Pick

DOMAIN_MODULES = ("bank", "library", "calendar", "warehouse", "flights", "hotel", "restaurant", "filesystem",
                  "email", "todo", "smarthome", "car_rental", "pharmacy", "school", "helpdesk", "shopping",
                  "social", "parking", "gym", "recipes")
SCENARIOS_PER_ENV = 30


def domains() -> dict[str, Domain]:
    """The registry: domain name -> Domain, in a fixed order."""
    found = [importlib.import_module(f"lopd_ray.envs.envscaler.domains.{m}").DOMAIN for m in DOMAIN_MODULES]
    return {d.name: d for d in found}


def domain_spec(domain: Domain) -> EnvSpec:
    cls = domain.env_class
    return EnvSpec(name=domain.name, introduction=domain.introduction, rules=list(domain.rules),
                   tools=tool_specs(cls), factory=cls, class_name=cls.__name__,
                   class_path=f"{cls.__module__}:{cls.__qualname__}")


def generate_scenario(domain: Domain, index: int) -> Scenario:
    draft = domain.kinds[index % len(domain.kinds)](Pick(f"envscaler/{domain.name}/{index}"))
    return Scenario(scenario_id=f"{domain.name}-{index:03d}", env_name=domain.name, task=draft.task,
                    init_config=draft.init, checks=list(draft.checks), oracle=list(draft.oracle))


def build_suite(scenarios_per_env: int = SCENARIOS_PER_ENV) -> Catalog:
    registry = domains()
    envs = {name: domain_spec(d) for name, d in registry.items()}
    scenarios = [generate_scenario(d, i) for d in registry.values() for i in range(scenarios_per_env)]
    return Catalog(envs, scenarios, origin="generated")
