"""Where benchmark data lives: `env.data_dir` if set, else $LOPD_RAY_DATA, else the repository's `data/` (the
benchmark files the shipped envs read, with their licenses and sources; the repository root is two levels above
this package directory)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from lopd_ray.errors import ConfigError

DATA_ENV_VAR = "LOPD_RAY_DATA"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def locate_data_root(data_dir: Optional[str]) -> tuple[Path, str]:
    """The benchmark data root and where the choice came from; it may not exist."""
    if data_dir:
        return Path(data_dir).expanduser(), "env.data_dir"
    if os.environ.get(DATA_ENV_VAR):
        return Path(os.environ[DATA_ENV_VAR]).expanduser(), f"${DATA_ENV_VAR}"
    return _REPO_ROOT / "data", "the repository's data/"


def data_root(env_cfg) -> Path:
    """The benchmark data root; a missing one is a one-line `ConfigError` naming env.data_dir and the fix."""
    root, source = locate_data_root(env_cfg.data_dir)
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
