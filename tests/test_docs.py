"""Every shell command that README.md and docs/*.md mark runnable on CPU (a fence opened with ```bash cpu) runs as
written, with small sizes: training and evaluation commands with `--check` (every check that needs no cluster,
the config keys of the line included), make targets as dry runs, the report commands for real on a short real run,
the other commands' `--help`. They run in a directory laid out like a checkout after `make demo`, so a run
directory the docs name under runs/ stands for the demo's (`runs/lopd_letters_cpu`, its `export/` the trained
student). A command no rule covers fails the test: add a rule here with the new command."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```bash cpu\n(.*?)^```", re.S | re.M)


def runnable_commands(path: Path) -> list[str]:
    """The commands of the file's ```bash cpu blocks: continuation lines joined, comments dropped, `a && b` split."""
    commands = []
    for block in FENCE.findall(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                commands.append(shlex.join(words[:cut]))
                words = words[cut + 1:]
    return commands


def with_help(words: list[str], program_words: int) -> list[str]:
    return [*words[:program_words], "--help"]


DEMO_RUN = "runs/lopd_letters_cpu"


def on_the_demo_run(word: str) -> str:
    return re.sub(r"^runs/[^/]+", DEMO_RUN, word)


# The leading words of a command -> how the test runs it.
RULES = {
    ("make",): lambda w: ["make", "-n", "-f", str(REPO / "Makefile"), *w[1:]],
    ("python", "-m", "lopd_ray.train"): lambda w: [*w, "--check"],
    ("python", "-m", "lopd_ray.eval"): lambda w: [*w, "--check"],
    ("python", "-m", "lopd_ray.report"): lambda w: w,
    ("python", "-m", "lopd_ray.envs.envscaler.stats"): lambda w: w,
    ("python", "-m", "lopd_ray.study"): lambda w: with_help(w, 3),
    ("python", "-m", "lopd_ray.study.latent_probe"): lambda w: with_help(w, 3),
    ("python", "-m", "lopd_ray.build_bank"): lambda w: with_help(w, 3),
    ("python", "-m", "lopd_ray.cold_start"): lambda w: with_help(w, 3),
    ("python", "-m", "lopd_ray.build_model"): lambda w: with_help(w, 3),
    ("python", "benchmarks/step_throughput.py"): lambda w: with_help(w, 2),
}


def as_run(command: str) -> list[str]:
    words = [on_the_demo_run(word) for word in shlex.split(command)]
    for prefix, rewrite in RULES.items():
        if tuple(words[:len(prefix)]) == prefix:
            argv = rewrite(words)
            return [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    raise AssertionError(f"no rule in tests/test_docs.py says how to run the documented command: {command}")


COMMANDS = [(path.relative_to(REPO).as_posix(), command) for path in DOCS for command in runnable_commands(path)]


def test_the_docs_mark_their_cpu_commands():
    """The marked commands include the README's main ones (a renamed fence would silently test nothing)."""
    readme = [command for path, command in COMMANDS if path == "README.md"]
    assert "make demo" in readme and "make test" in readme
    assert any(c.startswith("python -m lopd_ray.train recipes/lopd_letters_cpu.yaml") for c in readme)
    assert sum(path.startswith("docs/") for path, _ in COMMANDS) >= 3


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, ray_cluster):
    """A directory laid out like a checkout after `make demo`: recipes/ and benchmarks/ of the repo, and a real
    two-step LOPD run of the demo's recipe under runs/lopd_letters_cpu (fewer actors, a short cold start)."""
    from lopd_ray.config import load_config
    from lopd_ray.controller import Controller

    root = tmp_path_factory.mktemp("docs")
    for name in ("recipes", "benchmarks", "Makefile"):
        (root / name).symlink_to(REPO / name)
    cfg = load_config(str(REPO / "recipes" / "lopd_letters_cpu.yaml"),
                      ["train.total_steps=2", f"run.output_dir={root / 'runs'}", "rollout.num_workers=1",
                       "learner.num_learners=1", "rollout.engine=hf", "composer.cold_start_steps=2",
                       "run.progress_bar=false", "run.loggers=[]"])
    controller = Controller(cfg)
    try:
        controller.run()
    finally:
        controller.shutdown()
    return root


def run_documented(path: str, command: str, workdir: Path) -> str:
    """'' when the command succeeded, else what it printed."""
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ADDRESS="")
    proc = subprocess.run(as_run(command), cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else (f"{path}: `{command}` exited {proc.returncode}:\n{proc.stdout[-1500:]}\n"
                                            f"{proc.stderr[-1500:]}")


# Modules whose documented commands only check (`--check`): they run one after another in ONE interpreter, which
# imports their libraries once.
CHECK_ONLY = ("lopd_ray.train", "lopd_ray.eval")

RUN_IN_ONE_PROCESS = """
import contextlib, io, json, runpy, sys
for module, args in json.loads(sys.argv[1]):
    sys.argv, out, code = [module, *args], io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException as exc:
        code, _ = 1, out.write(repr(exc))
    print("RESULT " + json.dumps([code, out.getvalue()[-1500:]]), flush=True)
"""


def run_check_only(commands: list[tuple[str, str]], workdir: Path) -> list[str]:
    """The failures among `commands` (all of CHECK_ONLY modules), run in one interpreter."""
    argvs = [as_run(command)[2:] for _, command in commands]  # [module, args...] after `python -m`
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ADDRESS="")
    proc = subprocess.run([sys.executable, "-c", RUN_IN_ONE_PROCESS, json.dumps([[a[0], a[1:]] for a in argvs])],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == len(commands), proc.stdout[-2000:] + proc.stderr[-2000:]
    return [f"{path}: `{command}` exited {code}:\n{output}" for (path, command), (code, output) in zip(commands, results)
            if code != 0]


def test_every_documented_command_runs(workdir):
    """The check-only commands in one interpreter, beside the others two at a time: most of each command's time is
    importing its libraries."""
    from concurrent.futures import ThreadPoolExecutor

    check_only = [(p, c) for p, c in COMMANDS if as_run(c)[1:3] in (["-m", m] for m in CHECK_ONLY)]
    others = [pc for pc in COMMANDS if pc not in check_only]
    with ThreadPoolExecutor(max_workers=2) as pool:
        batch = pool.submit(run_check_only, check_only, workdir)
        failures = [f for f in pool.map(lambda pc: run_documented(*pc, workdir), others) if f] + batch.result()
    assert len(check_only) >= 10 and not failures, "\n\n".join(failures)


METHODS = ("GRPO", "DAPO", "LOPD", "OPSD", "OP2SD", "SDFT", "SDPO", "Skill-SD", "H2SD", "USD", "DualOPSD", "DOPD", "OPD")


def test_the_methods_table_states_source_and_deviations_for_every_method():
    text = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    header = "| method | source | context, placement | teacher weights | loss on the student | defaults"
    assert header in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| ") and line.count("|") >= 8 and not line.startswith(header)}
    assert set(METHODS) <= set(rows), f"no row for {sorted(set(METHODS) - set(rows))}"
    for name in METHODS:
        cells = [c.strip() for c in rows[name].replace("\\|", "¦").split("|")[1:-1]]
        assert len(cells) == 7 and all(cells[:5]) and cells[6], f"{name}: a source, context, weights, loss or " \
                                                                 f"deviation cell is empty: {cells}"


def test_the_readmes_loop_sketch_names_what_the_loop_calls():
    """Every call in README.md's sketch of the loop is a method of the controller (or of the objects it names there),
    and each is called in Controller.run, so the sketch cannot drift from the code."""
    import inspect

    from lopd_ray.controller import Controller
    from lopd_ray.idle_updates import IdleUpdates
    from lopd_ray.teacher.contexts import ContextProvider
    from lopd_ray.teacher.group import TeacherGroup

    readme = (REPO / "README.md").read_text()
    sketch = readme[readme.index("for step in range(start_step, total_steps):"):]
    sketch = sketch[:sketch.index("```")]
    code = "\n".join(line.split("#")[0] for line in sketch.splitlines())
    owners = {"teacher_group": TeacherGroup, "context": ContextProvider, "idle_updates": IdleUpdates}
    calls = re.findall(r"(?:(\w+)\.)?(\w+)\(", code)
    loop = inspect.getsource(Controller.run)
    assert len(calls) >= 12
    for owner, name in calls:
        if name in ("range", "len"):
            continue
        assert hasattr(owners.get(owner, Controller), name), f"README's loop sketch: {owner or 'Controller'}.{name}"
        assert f"{name}(" in loop, f"README's loop sketch: Controller.run never calls {name}"


def test_contributings_worked_examples_are_the_librarys_own_code():
    """Every code block of CONTRIBUTING.md's worked examples is in the repository as written (Python verbatim in a
    library or test file, YAML equal to a recipe), so the examples cannot drift from what the tests run."""
    import yaml

    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Adding a method"):text.index("## Before you push")]
    sources = [p.read_text() for p in [*(REPO / "lopd_ray").rglob("*.py"), *(REPO / "tests").glob("*.py")]]
    recipes = [yaml.safe_load(p.read_text()) for p in (REPO / "recipes").glob("*.yaml")]
    python = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    yamls = re.findall(r"^```yaml\n(.*?)^```", section, re.S | re.M)
    assert len(python) >= 6 and len(yamls) == 2
    for block in python:
        assert any(block in source for source in sources), f"not in the repository as written:\n{block}"
    for block in yamls:
        assert yaml.safe_load(block) in recipes, f"no recipe is:\n{block}"
