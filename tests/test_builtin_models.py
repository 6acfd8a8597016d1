"""Builtin models are cached under a fingerprint of their recipe: a changed recipe builds anew, an unchanged one
reuses the cache."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil

import pytest

from lopd_ray.models import BUILTIN_MODELS, resolve_model_path, tiny
from lopd_ray.warm_start import letters as warm_start


@pytest.fixture
def tiny_builds(tmp_path, monkeypatch) -> list[str]:
    """The directories build_tiny_model writes, in a fresh model cache."""
    monkeypatch.setenv("LOPD_RAY_CACHE", str(tmp_path / "cache"))
    builds = []
    build = tiny.build_tiny_model

    @functools.wraps(build)
    def counting_build(out_dir, *args, **kwargs):
        builds.append(out_dir)
        return build(out_dir, *args, **kwargs)

    monkeypatch.setattr(tiny, "build_tiny_model", counting_build)
    return builds


def _config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def test_changed_recipe_builds_a_new_directory_and_unchanged_one_reuses_it(tiny_builds, tmp_path, monkeypatch):
    first = resolve_model_path("builtin:tiny-qwen3")
    assert tiny_builds == [first] and _config(first)["num_hidden_layers"] == 2
    assert resolve_model_path("builtin:tiny-qwen3") == first and tiny_builds == [first]

    monkeypatch.setitem(tiny.ARCH_SIZES, "qwen3", {**tiny.ARCH_SIZES["qwen3"], "num_hidden_layers": 3})
    second = resolve_model_path("builtin:tiny-qwen3")
    assert second != first and tiny_builds == [first, second]
    assert _config(second)["num_hidden_layers"] == 3
    assert resolve_model_path("builtin:tiny-qwen3") == second and len(tiny_builds) == 2

    monkeypatch.undo()  # the first recipe again, and its cached model
    monkeypatch.setenv("LOPD_RAY_CACHE", str(tmp_path / "cache"))
    assert resolve_model_path("builtin:tiny-qwen3") == first and len(tiny_builds) == 2
    # Built atomically: only the two finished models, no temporary directory left behind.
    models = tmp_path / "cache" / "models"
    assert sorted(os.listdir(models)) == sorted(os.path.basename(d) for d in (first, second))
    assert all(os.path.basename(d).startswith("tiny-qwen3-") for d in (first, second))


def test_fingerprint_covers_version_parameters_constants_and_input_files(tmp_path, monkeypatch):
    entry, letters = BUILTIN_MODELS["tiny-qwen3"], BUILTIN_MODELS["tiny-qwen3-letters"]
    fingerprint, letters_fingerprint = entry.fingerprint(), letters.fingerprint()
    assert entry.fingerprint() == fingerprint
    assert fingerprint not in (BUILTIN_MODELS["tiny-llama"].fingerprint(), letters_fingerprint)

    assert dataclasses.replace(entry, version=entry.version + "+1").fingerprint() != fingerprint
    assert dataclasses.replace(entry, arguments={"arch": "qwen3", "seed": 1}).fingerprint() != fingerprint

    monkeypatch.setattr(warm_start, "WARM_START_LR", warm_start.WARM_START_LR * 2)
    assert letters.fingerprint() != letters_fingerprint and entry.fingerprint() == fingerprint

    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(entry.input_dirs[0], tokenizer_dir)
    copied = dataclasses.replace(entry, input_dirs=(str(tokenizer_dir),))
    assert copied.fingerprint() == fingerprint
    with open(tokenizer_dir / "tokenizer_config.json", "a") as f:
        f.write("\n")
    assert copied.fingerprint() != fingerprint


def test_a_model_not_built_yet_is_previewed_from_what_builds_it(tiny_builds, tiny_model_dir):
    """Before a build (the check's view), builtin:tiny-qwen3 has the tokenizer and context the built model has;
    SmolLM2's context comes from its GGUF's header (SmolLM2-135M's is 8192 positions)."""
    from transformers import AutoTokenizer

    from lopd_ray.models import built_model_dir, preview_model
    from lopd_ray.models.gguf_convert import find_smollm2_gguf
    from lopd_ray.models.preview import gguf_context_length

    assert built_model_dir("builtin:tiny-qwen3") is None
    preview = preview_model("builtin:tiny-qwen3")
    assert tiny_builds == [] and built_model_dir("builtin:tiny-qwen3") is None  # nothing built
    built = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert preview.tokenizer.get_vocab() == built.get_vocab() and preview.tokenizer.chat_template == built.chat_template
    assert preview.max_position_embeddings == _config(tiny_model_dir)["max_position_embeddings"] == 4096
    assert gguf_context_length(find_smollm2_gguf()) == 8192
