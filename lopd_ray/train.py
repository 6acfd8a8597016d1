"""`python -m lopd_ray.train RECIPE.yaml [key=value ...]`: validate the config, connect to Ray, train.

The same line runs on a laptop (a local Ray cluster is started) and behind `ray job submit` (the job's cluster is
used). Every config problem is reported in one line before any actor starts.
"""
from __future__ import annotations

import sys

from lopd_ray.config import Config, ConfigError, fit_to_cluster, load_config, validate_model, validate_resources
from lopd_ray.utils.runtime import apply_runtime_env, single_thread_torch

USAGE = "usage: python -m lopd_ray.train [RECIPE.yaml] [key=value ...]"


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + (__doc__ or ""))
        sys.exit(0)
    recipe = argv[0] if argv and "=" not in argv[0] else None
    return recipe, argv[1:] if recipe else argv


def connect_ray(cfg: Config) -> None:
    """Joins the cluster named by `ray.address` or RAY_ADDRESS (set under `ray job submit`), else starts one; then
    fits the config's GPU shares to it (`ray.accelerator`)."""
    import os

    import ray

    if not ray.is_initialized():
        address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False)
    available = ray.cluster_resources()
    dropped = fit_to_cluster(cfg, available)
    if dropped:
        print(f"ray.accelerator={cfg.ray.accelerator} and {available.get('GPU', 0):g} GPUs in the cluster: "
              f"{', '.join(dropped)} set to 0, every actor runs on CPU", flush=True)


def train(cfg: Config) -> None:
    import ray

    from lopd_ray.controller import Controller

    validate_resources(cfg, ray.cluster_resources())
    controller = Controller(cfg)
    try:
        controller.run()
    finally:
        controller.shutdown()


def main(argv: list[str] | None = None) -> int:
    apply_runtime_env()
    single_thread_torch()
    recipe, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(recipe, overrides)
        validate_model(cfg)
        connect_ray(cfg)
        train(cfg)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
