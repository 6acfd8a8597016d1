"""Model paths: an HF directory as is, or `builtin:<name>` for a model the project builds into its cache.

A builtin model's cache directory is `<cache>/models/<name>-<fingerprint>`, the fingerprint hashing its recipe, so a
change of recipe builds a new model instead of serving a stale one.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from lopd_ray.models import preview as previews
from lopd_ray.models.tiny_tokenizer import ASSET_DIR as TINY_TOKENIZER_DIR
from lopd_ray.utils.logs import phase

ENVSCALER_TOKENIZER_DIR = os.path.join(os.path.dirname(__file__), "assets", "envscaler_tokenizer")
RULES_MODEL_DIR = os.path.join(os.path.dirname(__file__), "assets", "tiny_qwen3_rules")
RULES_TOOL_MODEL_DIR = os.path.join(os.path.dirname(__file__), "assets", "tiny_qwen3_rules_tool")
ENVSCALER_SUITE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "envs", "envscaler")

BUILTIN_PREFIX = "builtin:"
FINGERPRINT_CHARS = 12


def cache_dir() -> str:
    return os.environ.get("LOPD_RAY_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lopd_ray"))


@dataclass(frozen=True)
class BuiltinModel:
    """How one builtin model is built: `builder(out_dir, **arguments)` writes its directory atomically."""

    # Bump on a change of the build that the builder's parameters, `constants` and `input_dirs` do not show.
    version: str
    # "module:function", imported when used: builders import torch, which this module must not.
    builder: str
    arguments: dict = field(default_factory=dict)
    # "module:function" returning the module constants and config defaults the build reads, called at each resolve
    # so that their current values count; "": none.
    constants: str = ""
    input_dirs: tuple[str, ...] = ()
    # The model's tokenizer and context length before it is built (models/preview.py), for `--check`.
    preview: Callable[[], previews.Preview] = functools.partial(previews.from_tokenizer_assets, TINY_TOKENIZER_DIR)

    def builder_function(self) -> Callable[..., object]:
        return _named(self.builder)

    def build(self, out_dir: str) -> None:
        self.builder_function()(out_dir, **self.arguments)

    def fingerprint(self) -> str:
        """A hash of the version, the builder with all its parameters (defaults included), the constants and the
        content of the input directories."""
        parameters = inspect.signature(self.builder_function()).bind_partial(**self.arguments)
        parameters.apply_defaults()
        recipe = {"version": self.version, "builder": self.builder, "parameters": parameters.arguments,
                  "constants": _named(self.constants)() if self.constants else {}}
        digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
        for input_dir in self.input_dirs:
            for root, dirs, files in os.walk(input_dir):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")  # compiled files vary by machine
                for name in sorted(files):
                    path = os.path.join(root, name)
                    digest.update(os.path.relpath(path, input_dir).encode() + b"\0")
                    with open(path, "rb") as f:
                        digest.update(hashlib.sha256(f.read()).digest())
        return digest.hexdigest()[:FINGERPRINT_CHARS]


def _named(spec: str) -> Callable:
    """The function "module:function" names, imported when used (builders import torch, which this module must not;
    the warm starts import the envs and the teacher's prompts, which import this module)."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _tiny(arch: str) -> BuiltinModel:
    return BuiltinModel(version="1", builder="lopd_ray.models.tiny:build_tiny_model", arguments={"arch": arch},
                        constants="lopd_ray.models.tiny:fingerprint_constants", input_dirs=(TINY_TOKENIZER_DIR,))


def _tiny_letters_warm(arch: str) -> BuiltinModel:
    return BuiltinModel(version="1", builder="lopd_ray.warm_start.letters:build_letters_warm_model",
                        arguments={"arch": arch}, constants="lopd_ray.warm_start.letters:fingerprint_constants",
                        input_dirs=(TINY_TOKENIZER_DIR,))


SMOLLM2_CONSTANTS = "lopd_ray.models.gguf_convert:fingerprint_constants"
BUILTIN_MODELS = {
    "tiny-qwen3": _tiny("qwen3"),
    "tiny-llama": _tiny("llama"),
    "tiny-qwen3-letters": _tiny_letters_warm("qwen3"),
    # The base model of the `rules` study (warm_start/rules.py): it reads a solved example in any method's framing.
    "tiny-qwen3-rules": BuiltinModel(version="1", builder="lopd_ray.warm_start.rules:build_rules_warm_model",
                                     input_dirs=(RULES_MODEL_DIR,),
                                     preview=functools.partial(previews.from_model_dir, RULES_MODEL_DIR)),
    # The base model of the multi-turn `rules_tool` study (warm_start/rules_tool.py).
    "tiny-qwen3-rules-tool": BuiltinModel(
        version="1", builder="lopd_ray.warm_start.rules_tool:build_rules_tool_warm_model",
        input_dirs=(RULES_TOOL_MODEL_DIR,), preview=functools.partial(previews.from_model_dir, RULES_TOOL_MODEL_DIR)),
    # The base model of the tool-use study (warm_start/envscaler.py); its input directories are the tokenizer and
    # the generator of the suite whose demonstrations it learns.
    "tiny-qwen3-envscaler": BuiltinModel(
        version="1", builder="lopd_ray.warm_start.envscaler:build_envscaler_warm_model",
        constants="lopd_ray.warm_start.envscaler:fingerprint_constants",
        input_dirs=(ENVSCALER_TOKENIZER_DIR, ENVSCALER_SUITE_DIR),
        preview=functools.partial(previews.from_tokenizer_assets, ENVSCALER_TOKENIZER_DIR)),
    "smollm2-135m-instruct": BuiltinModel(version="1", builder="lopd_ray.models.gguf_convert:convert_smollm2",
                                          constants=SMOLLM2_CONSTANTS, preview=previews.from_smollm2_gguf),
    # A student for distillation from SmolLM2-135M-Instruct: the same vocabulary, 8 of its 30 layers.
    "smollm2-student-8l": BuiltinModel(version="1", builder="lopd_ray.models.layer_drop:build_smollm2_student",
                                       arguments={"keep_every": 4}, constants=SMOLLM2_CONSTANTS,
                                       preview=previews.from_smollm2_gguf),
}


def builtin_model_dir(name: str) -> str:
    """The cache directory of `builtin:<name>` for its current recipe, built or not."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"model.path='builtin:{name}' is unknown: use one of "
                         f"{', '.join('builtin:' + n for n in BUILTIN_MODELS)} or an HF model directory")
    return os.path.join(cache_dir(), "models", f"{name}-{BUILTIN_MODELS[name].fingerprint()}")


def built_model_dir(path: str, key: str = "model.path") -> Optional[str]:
    """The HF directory `path` names as it is now, building nothing: an HF directory (checked), a builtin model's
    cache directory once built; None for a builtin model not built yet. `key` names the config key in the error."""
    if not path.startswith(BUILTIN_PREFIX):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{key}='{path}' is not an HF model directory (no config.json): give a directory "
                             f"saved by save_pretrained, or builtin:tiny-qwen3")
        return path
    out_dir = builtin_model_dir(path[len(BUILTIN_PREFIX):])
    return out_dir if os.path.isfile(os.path.join(out_dir, "config.json")) else None


def preview_model(path: str) -> previews.Preview:
    """The tokenizer and context length of the builtin model `path` ("builtin:<name>"), built or not."""
    return BUILTIN_MODELS[path[len(BUILTIN_PREFIX):]].preview()


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """Returns an HF directory, building a builtin model on first use. Call it in the driver, before actors start.
    `key` names the config key in the error."""
    out_dir = built_model_dir(path, key)
    if out_dir is None:
        out_dir = builtin_model_dir(path[len(BUILTIN_PREFIX):])
        with phase(f"building {path} on first use, into {out_dir}"):
            BUILTIN_MODELS[path[len(BUILTIN_PREFIX):]].build(out_dir)
    return out_dir
