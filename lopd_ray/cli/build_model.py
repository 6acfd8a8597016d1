"""`python -m lopd_ray.build_model [RECIPE.yaml] [key=value ...]`: builds the model a config names and prints its
HF directory. A `builtin:<name>` model (the tiny random models, the warm-started letters model, SmolLM2 converted
from its GGUF) is built into the cache on first use; an HF directory is checked as it is. Training builds the model
the same way, so this only moves the wait to a moment of the user's choosing.
"""
from __future__ import annotations

import sys

from lopd_ray.startup import command, recipe_and_overrides, start

USAGE = "usage: python -m lopd_ray.build_model [RECIPE.yaml] [key=value ...]\n\n" + (__doc__ or "")


def build_model(argv: list[str]) -> int:
    cfg, model_dir = start(*recipe_and_overrides(argv, USAGE), groups=lambda cfg: ())
    print(f"model.path={cfg.model.path} is the HF directory {model_dir}", flush=True)
    return 0


main = command(build_model)


if __name__ == "__main__":
    sys.exit(main())
