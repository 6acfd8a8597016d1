"""DeepSpeed and transformers imported without optional packages they import eagerly when installed and that no
code path here uses: MLflow (DeepSpeed's autotuner), scikit-learn (transformers' assisted generation, reached from
every model and tokenizer class) and SciPy (its object-detection losses). On a 2-core machine they cost each actor's
start several seconds. They stay importable afterwards (the MLflow metrics sink and sentence-transformers use them);
only transformers' own checks may keep taking them as absent in that process."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

UNUSED_EXTRAS = ("mlflow", "sklearn", "scipy")


@contextlib.contextmanager
def _hidden(names: tuple[str, ...]) -> Iterator[None]:
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError, which the libraries take as "not installed"
    try:
        yield
    finally:
        for name in hidden:
            sys.modules.pop(name, None)


def import_deepspeed():
    with _hidden(UNUSED_EXTRAS):
        import deepspeed
    return deepspeed


def preload_transformers() -> None:
    """Every actor loads a model or a tokenizer; this makes the first import of transformers' shared machinery."""
    with _hidden(UNUSED_EXTRAS):
        import transformers.generation.utils  # noqa: F401
