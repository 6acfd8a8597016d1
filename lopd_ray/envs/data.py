"""Where benchmark data lives: `env.data_dir` if set, else $LOPD_RAY_DATA, else `../shared/data` beside the checkout
(the repository root is two levels above this package directory)."""
from __future__ import annotations

import os
from pathlib import Path

from lopd_ray.config import ConfigError

DATA_ENV_VAR = "LOPD_RAY_DATA"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def data_root(env_cfg) -> Path:
    """The benchmark data root; a missing one is a one-line `ConfigError` naming env.data_dir and the fix."""
    if env_cfg.data_dir:
        root, source = Path(env_cfg.data_dir).expanduser(), "env.data_dir"
    elif os.environ.get(DATA_ENV_VAR):
        root, source = Path(os.environ[DATA_ENV_VAR]).expanduser(), f"${DATA_ENV_VAR}"
    else:
        root, source = _REPO_ROOT.parent / "shared" / "data", "the default beside the checkout"
    if not root.is_dir():
        raise ConfigError(f"benchmark data root {root} ({source}) does not exist: set env.data_dir=<dir holding "
                          f"humanevalplus/, mbppplus/, ...> or export {DATA_ENV_VAR}=<that dir>")
    return root


def data_file(env_cfg, relative: str) -> Path:
    """One file under the data root; a missing one is a one-line `ConfigError`."""
    path = data_root(env_cfg) / relative
    if not path.is_file():
        raise ConfigError(f"benchmark file {path} is missing: point env.data_dir (or ${DATA_ENV_VAR}) at a data "
                          f"root that holds {relative}")
    return path
