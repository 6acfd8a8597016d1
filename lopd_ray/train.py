"""`python -m lopd_ray.train RECIPE.yaml [key=value ...]`: validate the config, connect to Ray, train.

The same line runs on a laptop (a local Ray cluster is started) and behind `ray job submit` (the job's cluster is
used). Every config problem is reported in one line before any actor starts.
"""
from __future__ import annotations

import json
import sys

from lopd_ray.preflight import training_groups
from lopd_ray.startup import command, recipe_and_overrides, start

USAGE = "usage: python -m lopd_ray.train [RECIPE.yaml] [key=value ...]\n\n" + (__doc__ or "")


def train(argv: list[str]) -> int:
    from lopd_ray.controller import Controller

    cfg, _ = start(*recipe_and_overrides(argv, USAGE), groups=training_groups)
    print(json.dumps({"run_dir": cfg.run_dir}), flush=True)
    controller = Controller(cfg)
    try:
        controller.run_or_name_the_lost_actor()
    finally:
        controller.shutdown()
    print(json.dumps({"run_dir": cfg.run_dir, "finished": True}), flush=True)
    return 0


main = command(train)


if __name__ == "__main__":
    sys.exit(main())
