"""A model whose weights cannot load is refused by every command's checks, `--check` included, in one line, from the
weights files' headers (a cut copy, a missing shard), never by every actor at load time."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lopd_ray.models.weights_check import weights_damage

REPO = Path(__file__).resolve().parent.parent


def check(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="")
    return subprocess.run([sys.executable, "-m", *args, "--check"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.slow
def test_a_truncated_weights_file_is_one_line_for_eval_and_train_check(tiny_model_dir, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_dir, cut)
    weights = cut / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size - 1000)  # a copy that stopped early
    assert weights_damage(tiny_model_dir) is None
    for command in (["lopd_ray.eval", "--model", str(cut), "--bench", "letters"],
                    ["lopd_ray.train", "recipes/grpo_letters_cpu.yaml", f"model.path={cut}",
                     f"run.output_dir={tmp_path / 'runs'}"]):
        proc = check(*command)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (command[0], proc.returncode, proc.stderr[-2000:])
        assert lines[0].startswith(f"config error: model.path='{cut}' cannot be loaded: the weights file "
                                   f"model.safetensors: tensor "), lines[0]
        assert f"and the file has {size - 1000}: it is cut short: copy or download the model again" in lines[0]


def safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int, int]], tail: bytes = b"") -> None:
    """A safetensors file written by hand: name -> (dtype, shape, first byte, end byte) of a zero buffer."""
    header = json.dumps({name: {"dtype": d, "shape": s, "data_offsets": [b, e]}
                         for name, (d, s, b, e) in tensors.items()}).encode()
    data = max(e for _, _, _, e in tensors.values())
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(data) + tail)


def test_weights_headers_are_checked_against_the_file(tmp_path):
    model = tmp_path / "model.safetensors"
    whole = {"a": ("F32", [2], 0, 8), "b": ("BF16", [3, 2], 8, 20)}
    safetensors(model, whole)
    assert weights_damage(str(tmp_path)) is None
    header_bytes = model.stat().st_size - 20 - 8
    os.truncate(model, model.stat().st_size - 4)
    assert weights_damage(str(tmp_path)) == (f"the weights file model.safetensors: tensor b ends at byte "
                                             f"{8 + header_bytes + 20} and the file has {8 + header_bytes + 16}: it "
                                             f"is cut short")
    safetensors(model, {"a": ("F32", [3], 0, 8)})
    assert weights_damage(str(tmp_path)).endswith("tensor a takes 8 bytes, not the 12 of its shape")
    safetensors(model, {"a": ("F32", [1], 0, 4), "b": ("F32", [1], 8, 12)})
    assert weights_damage(str(tmp_path)).endswith("its tensors leave bytes 4-8 of the data unaccounted for")
    safetensors(model, whole, tail=b"xx")
    assert weights_damage(str(tmp_path)).endswith("2 bytes follow its last tensor")
    model.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    assert weights_damage(str(tmp_path)).endswith(f"its header says it is {1 << 40} bytes long and the file has 10")
    model.unlink()
    assert weights_damage(str(tmp_path)).startswith("it holds no weights")
    # Shards: every file the index names exists and holds the tensors it is said to.
    safetensors(tmp_path / "part-1.safetensors", {"a": ("F32", [2], 0, 8)})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "part-1.safetensors", "b": "part-1.safetensors"}}))
    assert weights_damage(str(tmp_path)) == ("the weights file part-1.safetensors: b is not in it, though "
                                             "model.safetensors.index.json says so")
    index.write_text(json.dumps({"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}))
    assert weights_damage(str(tmp_path)) == "part-2.safetensors, a shard model.safetensors.index.json names, is missing"


def test_a_nan_or_an_infinity_in_the_weights_is_named(tmp_path):
    import numpy as np

    model = tmp_path / "model.safetensors"
    bf16 = lambda values: (np.array(values, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()  # noqa
    for dtype, bad in (("F32", np.array([1.0, np.nan], np.float32).tobytes()),
                       ("F16", np.array([1.0, -np.inf], np.float16).tobytes()), ("BF16", bf16([1.0, np.inf]))):
        width = len(bad) // 2
        header = json.dumps({"ok": {"dtype": dtype, "shape": [2], "data_offsets": [0, 2 * width]},
                             "bad": {"dtype": dtype, "shape": [2], "data_offsets": [2 * width, 4 * width]}}).encode()
        finite = np.array([0.5, -2.0], np.float32)
        ok = {"F32": finite.tobytes(), "F16": finite.astype(np.float16).tobytes(), "BF16": bf16(finite)}[dtype]
        model.write_bytes(struct.pack("<Q", len(header)) + header + ok + ok)
        assert weights_damage(str(tmp_path)) is None, dtype
        model.write_bytes(struct.pack("<Q", len(header)) + header + ok + bad)
        assert weights_damage(str(tmp_path)) == ("the weights file model.safetensors: tensor bad holds NaN or "
                                                 "infinite values (a diverged training run?); take an earlier "
                                                 "checkpoint"), dtype


@pytest.mark.slow
def test_train_check_refuses_a_model_whose_weights_hold_nan(tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "nan"
    shutil.copytree(tiny_model_dir, broken)
    weights = load_file(str(broken / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    proc = check("lopd_ray.train", "recipes/grpo_letters_cpu.yaml", f"model.path={broken}",
                 f"run.output_dir={tmp_path / 'runs'}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [f"config error: model.path='{broken}' cannot be loaded: the weights file "
                                              f"model.safetensors: tensor {name} holds NaN or infinite values (a "
                                              f"diverged training run?); take an earlier checkpoint: copy or download "
                                              f"the model again, or save it again with save_pretrained"], proc.stderr
    assert torch.isnan(load_file(str(broken / "model.safetensors"))[name]).any()
