"""Model paths: an HF directory as is, or `builtin:<name>` for a model the project builds into its cache."""
from __future__ import annotations

import os

BUILTIN_PREFIX = "builtin:"


def cache_dir() -> str:
    return os.environ.get("LOPD_RAY_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lopd_ray"))


def _tiny(arch: str):
    def build(out_dir: str) -> None:
        from lopd_ray.models.tiny import build_tiny_model
        build_tiny_model(out_dir, arch=arch)
    return build


def _tiny_letters(arch: str):
    def build(out_dir: str) -> None:
        from lopd_ray.models.warm_start import build_letters_warm_model
        build_letters_warm_model(out_dir, arch=arch)
    return build


def _smollm2(out_dir: str) -> None:
    from lopd_ray.models.gguf_convert import convert_smollm2
    convert_smollm2(out_dir)


# builtin:<name> -> builder(out_dir). Each writes its directory atomically.
BUILTIN_MODELS = {
    "tiny-qwen3": _tiny("qwen3"),
    "tiny-llama": _tiny("llama"),
    "tiny-qwen3-letters": _tiny_letters("qwen3"),
    "smollm2-135m-instruct": _smollm2,
}


def _build_builtin(name: str, out_dir: str) -> None:
    if name not in BUILTIN_MODELS:
        raise ValueError(f"model.path='builtin:{name}' is unknown: use one of "
                         f"{', '.join('builtin:' + n for n in BUILTIN_MODELS)} or an HF model directory")
    BUILTIN_MODELS[name](out_dir)


def resolve_model_path(path: str) -> str:
    """Returns an HF directory, building a builtin model on first use. Call it in the driver, before actors start."""
    if not path.startswith(BUILTIN_PREFIX):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"model.path='{path}' is not an HF model directory (no config.json): give a directory "
                             f"saved by save_pretrained, or builtin:tiny-qwen3")
        return path
    name = path[len(BUILTIN_PREFIX):]
    out_dir = os.path.join(cache_dir(), "models", name)
    if not os.path.isfile(os.path.join(out_dir, "config.json")):
        _build_builtin(name, out_dir)
    return out_dir
