"""`python -m lopd_ray.envs.envscaler.stats [--data-dir DIR]`: the size and shape of the envscaler suite."""
from __future__ import annotations

import argparse
from statistics import mean
from typing import Optional

from lopd_ray.envs.envscaler.core import Catalog, Scenario, dependent_calls
from lopd_ray.envs.envscaler.env import split_scenarios
from lopd_ray.envs.envscaler.loader import load_catalog


def _summary(scenarios: list[Scenario]) -> dict[str, float]:
    return {"scenarios": len(scenarios),
            "mean_checks": mean(len(s.checks) for s in scenarios) if scenarios else 0.0,
            "mean_oracle_calls": mean(len(s.oracle) for s in scenarios) if scenarios else 0.0,
            "dependent3_share": mean(dependent_calls(s.oracle) >= 3 for s in scenarios) if scenarios else 0.0}


def suite_stats(catalog: Catalog) -> dict[str, float]:
    tools = [len(spec.tools) for spec in catalog.envs.values()]
    return {"environments": len(catalog.envs), **_summary(catalog.scenarios),
            "train": len(split_scenarios(catalog, "train")), "test": len(split_scenarios(catalog, "test")),
            "tools": sum(tools), "tools_per_env": mean(tools) if tools else 0.0,
            "max_oracle_calls": max((len(s.oracle) for s in catalog.scenarios), default=0)}


def report(catalog: Catalog) -> str:
    s = suite_stats(catalog)
    lines = [f"envscaler suite ({catalog.origin})",
             f"environments: {s['environments']}",
             f"scenarios: {s['scenarios']} (train {s['train']}, test {s['test']})",
             f"tools: {s['tools']} ({s['tools_per_env']:.1f} per environment)",
             f"mean checks per scenario: {s['mean_checks']:.2f}",
             f"mean oracle calls per scenario: {s['mean_oracle_calls']:.2f} (max {s['max_oracle_calls']})",
             f"scenarios with 3+ dependent calls: {100 * s['dependent3_share']:.1f}%",
             "",
             f"{'environment':<14}{'tools':>6}{'scenarios':>10}{'checks':>8}{'calls':>7}{'dep3+':>8}"]
    for name, spec in catalog.envs.items():
        e = _summary([x for x in catalog.scenarios if x.env_name == name])
        lines.append(f"{name:<14}{len(spec.tools):>6}{e['scenarios']:>10}{e['mean_checks']:>8.2f}"
                     f"{e['mean_oracle_calls']:>7.2f}{100 * e['dependent3_share']:>7.0f}%")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", default=None, help="data root holding envscaler/ (default: the generated suite "
                                                         "unless $LOPD_RAY_DATA or data/ holds one)")
    print(report(load_catalog(parser.parse_args(argv).data_dir)))


if __name__ == "__main__":
    main()
