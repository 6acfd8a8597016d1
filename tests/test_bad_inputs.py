"""Bad inputs that can be known before anything starts are refused in one `config error:` line, exit code 2, before
Ray or any actor starts, and the files named are left as they were: a bank snapshot missing its vectors, a model
whose config.json is broken, a `build_bank --out` that would replace a file or a folder of other files."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Well below the minute or two a start-up of the cluster and the actors takes before these were found.
UP_FRONT_S = 60.0


def refused_up_front(args: list[str], *said: str) -> str:
    """Runs a command that must stop in its checks; returns its one line."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\n{output[-3000:]}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("config error: "), output[-3000:]
    assert all(s in lines[0] for s in said), lines[0]
    assert "Traceback" not in output and "Ray" not in output, output[-3000:]
    assert not any(line.startswith("starting ") for line in output.splitlines()), output[-3000:]  # actors
    assert seconds < UP_FRONT_S, f"refused after {seconds:.0f} s"
    return lines[0]


@pytest.mark.slow
def test_a_bank_snapshot_missing_its_vectors_is_refused_before_the_start(tmp_path):
    import dataclasses

    from lopd_ray.bank.bank import ExperienceBank
    from lopd_ray.bank.traces import BankEntry
    from lopd_ray.config import BankConfig

    bank = ExperienceBank(BankConfig())
    bank.add([BankEntry(f"t{i}@v0#1", f"t{i}", text, "Action: done", 1.0, 0)
              for i, text in enumerate(("Reply with 'a' three times", "Reply with 'b' twice"))])
    snapshot = tmp_path / "bank"
    bank.snapshot(str(snapshot))
    kept = {p.name: p.read_bytes() for p in snapshot.iterdir() if p.name != "vectors.npy"}
    (snapshot / "vectors.npy").unlink()
    line = refused_up_front(["-m", "lopd_ray.train", "recipes/lopd_letters_cpu.yaml", f"bank.init_path={snapshot}",
                             f"run.output_dir={tmp_path / 'runs'}"],
                            f"bank.init_path='{snapshot}' is not a whole bank snapshot: vectors.npy missing",
                            "python -m lopd_ray.build_bank")
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == kept
    # a snapshot of other documents than the run embeds is refused the same way, naming the setting
    bank = ExperienceBank(dataclasses.replace(BankConfig(), documents="task_trace"))
    bank.add([BankEntry("t0@v0#1", "t0", "Reply with 'a' three times", "Action: done", 1.0, 0)])
    bank.snapshot(str(snapshot))
    assert line != refused_up_front(["-m", "lopd_ray.train", "recipes/lopd_letters_cpu.yaml",
                                     f"bank.init_path={snapshot}", f"run.output_dir={tmp_path / 'runs'}"],
                                    "embeds documents 'task_trace'", "set bank.documents=task_trace")


BROKEN_CONFIGS = {"cut short": ('{"architectures": ["Qwen3ForCausalLM"], "hidden_', "is not valid JSON"),
                  "no model_type": ('{"hidden_size": 64}', "names no model_type"),
                  "unknown model_type": ('{"model_type": "no-such-architecture"}', "transformers cannot read")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", BROKEN_CONFIGS)
def test_an_eval_model_with_a_broken_config_json_is_refused_before_the_start(tiny_model_dir, tmp_path, kind):
    text, said = BROKEN_CONFIGS[kind]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "config.json").write_text(text)
    line = refused_up_front(["-m", "lopd_ray.eval", "--model", str(model), "--bench", "letters",
                             "--out", str(tmp_path / "eval")], f"model.path='{model}': ", said)
    assert line.endswith("restore it from where the model came from, or save the model again with save_pretrained")
    assert (model / "config.json").read_text() == text


@pytest.mark.slow
def test_build_bank_out_on_a_file_or_a_folder_of_other_files_is_refused_before_the_start(tmp_path):
    kept = tmp_path / "notes.txt"
    kept.write_text("not a bank")
    refused_up_front(["-m", "lopd_ray.build_bank", "recipes/lopd_letters_cpu.yaml", "--out", str(kept)],
                     f"--out={kept} is an existing file, and a bank snapshot is a directory")
    assert kept.read_text() == "not a bank"
    refused_up_front(["-m", "lopd_ray.build_bank", "recipes/lopd_letters_cpu.yaml", "--out", str(tmp_path)],
                     f"--out={tmp_path} is a directory of other files, not a bank snapshot")
    assert kept.read_text() == "not a bank"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["file", "unwritable"])
def test_an_output_dir_that_is_a_file_or_cannot_be_written_is_refused_before_the_start(tmp_path, case):
    if case == "file":
        (tmp_path / "runs").write_text("not a folder")
        output, said = tmp_path / "runs", "is a file, not a folder"
    else:  # /proc takes no new files, for root too (a chmod would not stop root)
        output, said = Path("/proc/lopd_ray_runs"), "cannot write in /proc"
    for command in (["-m", "lopd_ray.train", "recipes/grpo_letters_cpu.yaml"],
                    ["-m", "lopd_ray.train", "recipes/grpo_letters_cpu.yaml", "--check"]):
        refused_up_front([*command, f"run.output_dir={output}"], "run.output_dir", said)
    if case == "file":
        assert (tmp_path / "runs").read_text() == "not a folder"
