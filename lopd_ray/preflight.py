"""Checks that need more than the schema, run by every command before any actor starts: the registry names, the
keys the chosen algorithm reads, the model and the env's prompts, and the resources against the Ray cluster. Each
failure is one `ConfigError` line naming the key and the fix."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import tempfile
from typing import Any, Optional

from lopd_ray.algorithms import ALGORITHMS, make_algorithm
from lopd_ray.config import GPU_SHARE_KEYS, SHARDING_ENGINES, Config, EnvConfig, section_and_name, value_of
from lopd_ray.envs import ENVS, EVERY_ENV_READS, env_options, env_spec, make_env
from lopd_ray.bank.index import INDEXES
from lopd_ray.errors import ConfigError, require
from lopd_ray.modeling.student_lora import check_targets as check_lora_targets
from lopd_ray.learner.weight_sync import WEIGHT_SYNCS
from lopd_ray.models import BUILTIN_PREFIX, built_model_dir, preview_model, resolve_model_path
from lopd_ray.models.weights_check import weights_damage
from lopd_ray.rollout.agent_loop import TURN_SCHEDULES
from lopd_ray.rollout.engines import ENGINES
from lopd_ray.teacher.contexts import CONTEXTS
from lopd_ray.teacher.skills import SKILL_WRITERS
from lopd_ray.teacher.weights import TEACHER_WEIGHTS, steps_toward_student
from lopd_ray.utils.metric_sinks import METRIC_SINKS, SINK_PACKAGES

# The actor groups a command may create -> (how many, CPU share key, GPU share key) as config keys.
ACTOR_GROUPS = {
    "rollout": ("rollout.num_workers", "rollout.cpus_per_worker", "rollout.gpus_per_worker"),
    "learner": ("learner.num_learners", "learner.cpus_per_learner", "learner.gpus_per_learner"),
    "teacher": ("teacher.num_workers", "teacher.cpus_per_worker", "teacher.gpus_per_worker"),
    "bank": (None, "bank.cpus", "bank.gpus"),
}


def check_registries(cfg: Config) -> None:
    """The registry names, then the chosen algorithm's own checks (those of its sections' names among them)."""
    env_options(cfg.env, env_spec(cfg.env.name))
    for key, table in (("algorithm.name", ALGORITHMS), ("rollout.engine", ENGINES),
                       ("sync.method", WEIGHT_SYNCS), ("teacher.weights", TEACHER_WEIGHTS),
                       ("context.name", CONTEXTS), ("context.skill.writer", SKILL_WRITERS), ("bank.index", INDEXES),
                       ("rollout.turns", TURN_SCHEDULES)):
        require(value_of(cfg, key) in table,
                f"{key}='{value_of(cfg, key)}' is not registered: choose one of {sorted(table)}")
    ro = cfg.rollout
    require(ro.tensor_parallel_size == 1 or ro.engine in SHARDING_ENGINES,
            f"rollout.tensor_parallel_size={ro.tensor_parallel_size} needs an engine that shards a model "
            f"({', '.join(SHARDING_ENGINES)}), not rollout.engine={ro.engine}")
    require(ro.tensor_parallel_size == 1 or ro.gpus_per_worker == ro.tensor_parallel_size,
            f"rollout.tensor_parallel_size={ro.tensor_parallel_size} shards the model over that many GPUs per "
            f"worker: set rollout.gpus_per_worker={ro.tensor_parallel_size} (it is {ro.gpus_per_worker:g})")
    context = CONTEXTS[cfg.context.name]
    ALGORITHMS[cfg.algorithm.name].check(cfg, context)
    if ALGORITHMS[cfg.algorithm.name].needs_teacher:
        context.check(cfg, lambda: make_env(cfg.env)[1])
    require(not steps_toward_student(cfg.teacher) or (make_algorithm(cfg.algorithm).divergence is not None
                                                        and not context.uses_latents),
            f"teacher.weights={cfg.teacher.weights} steps the teacher's backbone on a top-M divergence of a text "
            f"context: choose a top-M divergence as algorithm.distill.loss and a context other than latent")
    for name in cfg.run.loggers:
        require(name in METRIC_SINKS, f"run.loggers: '{name}' is not registered: choose among {sorted(METRIC_SINKS)}")
        require(importlib.util.find_spec(SINK_PACKAGES[name]) is not None,
                 f"run.loggers: '{name}' needs the {SINK_PACKAGES[name]} package: pip install -e '.[loggers]' "
                 f"or drop it from run.loggers")


def _changed_keys(value: Any, default: Any, prefix: str) -> list[str]:
    """Dotted keys under `prefix` whose value differs from the schema default."""
    if dataclasses.is_dataclass(value):
        return [key for f in dataclasses.fields(value)
                for key in _changed_keys(getattr(value, f.name), getattr(default, f.name), f"{prefix}.{f.name}")]
    return [prefix] if value != default else []


def gated_sections(env_name: str = "") -> dict[str, tuple[str, frozenset[str]]]:
    """Config sections and keys that only some choices read: section or key -> (the key that chooses, the values
    that read it); `env_name` an env named by import path, which reads what its EnvSpec declares."""
    envs = {**ENVS, env_name: env_spec(env_name)} if env_name and env_name not in ENVS else ENVS
    keys = [f.name for f in dataclasses.fields(EnvConfig)]
    gated: dict[str, tuple[str, set[str]]] = {f"env.{name}": ("env.name", {name}) for name in keys if name in ENVS}
    for name in keys:  # the env section's own keys: read by the envs that declare them
        key = f"env.{name}"
        if name not in ENVS and key not in (*EVERY_ENV_READS, "env.options"):  # env_options checks env.options
            gated[key] = ("env.name", {env for env, spec in envs.items() if key in spec.reads})
    sections = Config().context
    for name, provider in CONTEXTS.items():
        if hasattr(sections, name):  # providers with settings of their own
            gated[f"context.{name}"] = ("context.name", {name})
        for section in provider.reads:
            gated.setdefault(section, ("context.name", set()))[1].add(name)
    for name, algorithm in ALGORITHMS.items():
        for section in algorithm.reads:
            gated.setdefault(section, ("algorithm.name", set()))[1].add(name)
    return {section: (key, frozenset(values)) for section, (key, values) in gated.items()}


def check_unread_keys(cfg: Config, command_reads: tuple[str, ...] = ()) -> None:
    """A key under a section that only some algorithms or envs read (algorithm.grpo, bank, env.code, ...), set away
    from its default while neither the chosen algorithm and env nor the command reads it, is a mistake: it would be
    silently ignored."""
    defaults = Config()
    command_reads = (*command_reads, *ALGORITHMS[cfg.algorithm.name].reads_for(cfg.algorithm))
    for section, (key, readers) in sorted(gated_sections(cfg.env.name).items()):
        if value_of(cfg, key) in readers or section in command_reads:
            continue
        changed = _changed_keys(value_of(cfg, section), value_of(defaults, section), section)
        if changed:
            raise ConfigError(f"{changed[0]}={value_of(cfg, changed[0])} is never read by {key}="
                              f"{value_of(cfg, key)}: remove it ({key}={' or '.join(sorted(readers))} reads it)")


def model_source(path: str, key: str, build: bool) -> str:
    """The HF directory of the model `path` names (a builtin model built on first use); without `build`, a builtin
    model not built yet stays "builtin:<name>", whose tokenizer and context length are read without building it."""
    try:
        return resolve_model_path(path, key) if build else built_model_dir(path, key) or path
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def models_to_build(cfg: Config, groups: tuple[str, ...]) -> list[str]:
    """The builtin models (model.path, a different teacher's) that a run would build first, not being built yet."""
    paths = [cfg.model.path] + ([cfg.teacher.model_path] if "teacher" in groups and cfg.teacher.model_path else [])
    return [path for path in paths if path.startswith(BUILTIN_PREFIX) and model_source(path, "", False) == path]


@functools.lru_cache(maxsize=8)
def _preview(source: str):
    return preview_model(source)


def check_weights(path: str, source: str, key: str) -> None:
    """The weights files of the model `path` names (at `source`) are whole, from their headers: a cut copy is refused
    here, not when every actor loads it (a builtin model not built yet has none to check)."""
    problem = None if source.startswith(BUILTIN_PREFIX) else weights_damage(source)
    again = (f"delete {source} and it is built again" if path.startswith(BUILTIN_PREFIX)
             else "copy or download the model again, or save it again with save_pretrained")
    require(problem is None, f"{key}='{path}' cannot be loaded: {problem}: {again}")


def _context_limit(source: str) -> Optional[int]:
    if source.startswith(BUILTIN_PREFIX):
        return _preview(source).max_position_embeddings
    with open(os.path.join(source, "config.json")) as f:
        return json.load(f).get("max_position_embeddings")


def check_model_and_env(cfg: Config, groups: tuple[str, ...], build: bool = True) -> str:
    """Resolves `model.path` (building a builtin model on first use; without `build`, never) and
    `rollout.max_model_len=0` (the model's limit), and checks the config against the model and the env's prompts:
    the context fits the model, the longest task prompt leaves room to answer, and, where learners train, a whole
    episode fits one micro-batch. Returns the HF directory (without `build`, "builtin:<name>" for a model not built
    yet)."""
    path = model_source(cfg.model.path, "model.path", build)
    check_weights(cfg.model.path, path, "model.path")
    limit = _context_limit(path)
    ro = cfg.rollout
    if ro.max_model_len == 0:
        require(limit is not None, f"rollout.max_model_len=0 asks for the model's limit, but {path}/config.json "
                                    f"has no max_position_embeddings: set rollout.max_model_len")
        ro.max_model_len = limit
    require("learner" not in groups or ro.max_model_len <= cfg.learner.max_tokens_per_micro_batch,
            f"rollout.max_model_len={ro.max_model_len} exceeds learner.max_tokens_per_micro_batch="
            f"{cfg.learner.max_tokens_per_micro_batch}: a full-length trajectory must fit one micro-batch; raise "
            f"the budget")
    require(limit is None or ro.max_model_len <= limit,
            f"rollout.max_model_len={ro.max_model_len} exceeds the model's max_position_embeddings={limit} "
            f"({path}): lower rollout.max_model_len to at most {limit}")
    if "teacher" in groups and cfg.teacher.model_path:
        check_teacher_model(cfg, _tokenizer(path), build)
    if "learner" in groups and cfg.learner.lora.rank and not path.startswith(BUILTIN_PREFIX):  # else once built
        check_lora_targets(path, cfg.learner.lora)
    longest, has_references, held_out = prompt_facts(path, cfg.env, cfg.held_out_env if cfg.eval.every_steps else None)
    require(not cfg.eval.every_steps or held_out > 0,
            f"eval.split='{cfg.eval.split}' of env.name={cfg.env.name} has no tasks: choose a split that has some "
            f"(e.g. test) or set eval.every_steps=0")
    require(not (ALGORITHMS[cfg.algorithm.name].needs_teacher and CONTEXTS[cfg.context.name].needs_reference_solutions)
            or has_references,
            f"context.name={cfg.context.name} shows the teacher verified solutions, but env.name={cfg.env.name} has "
            f"none: choose an env with reference solutions (e.g. letters or code) or another context")
    require(longest + ro.max_new_tokens <= ro.max_model_len,
            f"the longest {cfg.env.name} prompt is {longest} tokens, which with rollout.max_new_tokens="
            f"{ro.max_new_tokens} exceeds rollout.max_model_len={ro.max_model_len}: raise rollout.max_model_len "
            f"(the model allows {limit}) or lower rollout.max_new_tokens")
    return path


@functools.lru_cache(maxsize=8)
def _tokenizer(source: str):
    """The tokenizer of an HF directory, or of a builtin model not built yet."""
    from transformers import AutoTokenizer

    return _preview(source).tokenizer if source.startswith(BUILTIN_PREFIX) else AutoTokenizer.from_pretrained(source)


_PROMPT_FACTS: dict[str, tuple[int, bool, int]] = {}


def prompt_facts(model_dir: str, env_cfg, held_out_cfg) -> tuple[int, bool, int]:
    """The longest task prompt in tokens (train and held-out tasks), whether the env has reference solutions, and
    how many held-out tasks there are; the same model and envs give the same facts, so a process computes them
    once."""
    from lopd_ray.rollout.agent_loop import render_ids

    key = repr((model_dir, env_cfg, held_out_cfg))
    if key not in _PROMPT_FACTS:
        tokenizer = _tokenizer(model_dir)
        _, tasks = make_env(env_cfg)
        held_out = make_env(held_out_cfg)[1] if held_out_cfg is not None else []
        longest = max(len(render_ids(tokenizer, source[i].messages, add_generation_prompt=True))
                      for source in (tasks, held_out) for i in range(len(source)))
        _PROMPT_FACTS[key] = (longest, tasks.reference_solution(0) is not None, len(held_out))
    return _PROMPT_FACTS[key]


def check_same_vocabulary(student_tokenizer, teacher_tokenizer, teacher_path: str) -> None:
    """Token-level distillation compares the two models' distributions token id by token id."""
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    differ = sum(teacher.get(token) != index for token, index in student.items()) + len(set(teacher) - set(student))
    require(differ == 0,
            f"teacher.model_path='{teacher_path}' has a different vocabulary from model.path ({differ} tokens "
            f"differ): token-level distillation needs the same tokenizer; choose a teacher of the student's family")


def check_teacher_model(cfg: Config, student_tokenizer, build: bool = True) -> None:
    """A different teacher model: resolved (built on first use, with `build`) and checked against the student's
    vocabulary."""
    path = model_source(cfg.teacher.model_path, "teacher.model_path", build)
    check_weights(cfg.teacher.model_path, path, "teacher.model_path")
    check_same_vocabulary(student_tokenizer, _tokenizer(path), cfg.teacher.model_path)


def training_groups(cfg: Config) -> tuple[str, ...]:
    """The actor groups a training run of `cfg`'s algorithm creates."""
    if not ALGORITHMS[cfg.algorithm.name].needs_teacher:
        return "rollout", "learner"
    return ("rollout", "learner", "teacher") + (("bank",) if CONTEXTS[cfg.context.name].needs_bank else ())


def requested_resources(cfg: Config, groups: tuple[str, ...]) -> dict[str, tuple[float, str]]:
    """Resource name -> (amount the `groups`' actors ask for, the keys that set it)."""
    out = {}
    for resource, column in (("CPU", 1), ("GPU", 2)):
        amount, keys = 0.0, []
        for group in groups:
            count_key, share_key = ACTOR_GROUPS[group][0], ACTOR_GROUPS[group][column]
            amount += (value_of(cfg, count_key) if count_key else 1) * value_of(cfg, share_key)
            keys.append(f"{count_key}*{share_key}" if count_key else share_key)
        out[resource] = (amount, " + ".join(keys))
    return out


def training_resources(cfg: Config) -> dict[str, float]:
    """The CPUs and GPUs a training run of `cfg` asks Ray for, every actor group counted: {"CPU": .., "GPU": ..}."""
    return {name: round(amount, 6) for name, (amount, _) in requested_resources(cfg, training_groups(cfg)).items()}


# Groups whose actors are placed in a placement group: each actor's bundle needs a CPU or GPU share.
PLACED_GROUPS = ("rollout", "learner", "teacher")


def check_resources(cfg: Config, groups: tuple[str, ...], available: dict[str, float]) -> None:
    """`available` is `ray.cluster_resources()`."""
    for group in set(groups) & set(PLACED_GROUPS):
        _, cpu_key, gpu_key = ACTOR_GROUPS[group]
        require(value_of(cfg, cpu_key) + value_of(cfg, gpu_key) > 0,
                f"{cpu_key}=0 and {gpu_key}=0 on this cluster: each rank is placed in a bundle of its own CPU or GPU "
                f"share; set {cpu_key} above 0")
    require(cfg.rollout.tensor_parallel_size == 1 or cfg.rollout.gpus_per_worker > 0 or "rollout" not in groups,
            f"rollout.tensor_parallel_size={cfg.rollout.tensor_parallel_size} shards the model over GPUs, and this "
            f"run has none (ray.accelerator={cfg.ray.accelerator}, {available.get('GPU', 0):g} GPUs in the "
            f"cluster): set rollout.tensor_parallel_size=1")
    for name, (amount, keys) in requested_resources(cfg, groups).items():
        have = float(available.get(name, 0.0))
        require(amount <= have + 1e-9,
                f"the run asks for {amount:g} {name} ({keys}) but the Ray cluster has {have:g}: "
                f"lower those settings or add nodes with {name}s")


def check_bundles_fit(cfg: Config, groups: tuple[str, ...], nodes: list[dict[str, float]]) -> None:
    """Each actor's bundle must fit on one node (`nodes`: every alive node's resources), or its placement group
    would wait forever: a worker of 2 GPUs cannot span two nodes of 1."""
    for group in set(groups) & set(PLACED_GROUPS):
        _, cpu_key, gpu_key = ACTOR_GROUPS[group]
        need = {"CPU": value_of(cfg, cpu_key), "GPU": value_of(cfg, gpu_key)}
        require(any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in need.items()) for node in nodes),
                f"one {group} actor asks for {need['CPU']:g} CPU and {need['GPU']:g} GPU ({cpu_key}, {gpu_key}) on "
                f"one node, and no node of the cluster has that much: lower them or add a larger node")


def fit_to_cluster(cfg: Config, available: dict[str, float]) -> list[str]:
    """Applies `ray.accelerator` to `available` (`ray.cluster_resources()`): sets the GPU shares to 0 when the run
    is to stay on CPU. Returns the keys it set to 0."""
    use_gpus = {"gpu": True, "cpu": False, "auto": float(available.get("GPU", 0.0)) > 0}[cfg.ray.accelerator]
    dropped = []
    for key in GPU_SHARE_KEYS if not use_gpus else ():
        if value_of(cfg, key) > 0:
            setattr(*section_and_name(cfg, key), 0.0)
            dropped.append(key)
    return dropped


# ---- the files a command reads or replaces, checked before anything starts ------------------------------------
def check_input_files(cfg: Config, groups: tuple[str, ...]) -> None:
    """The models' config.json files read, and a bank snapshot to start from is whole."""
    check_model_config(cfg.model.path, "model.path")
    if "teacher" in groups and cfg.teacher.model_path:
        check_model_config(cfg.teacher.model_path, "teacher.model_path")
    if "bank" in groups and cfg.bank.init_path:
        check_bank_snapshot(cfg.bank.init_path, cfg.bank.documents)


def _bytes_under(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(directory) for name in names)


def check_run_folder(cfg: Config) -> None:
    """The run's folder, or the nearest existing folder above it, must be a folder this user can write in (a probe
    file is created and removed): a file in its place, or a read-only disk, is refused here, before the log file."""
    key = "run.staging_dir" if cfg.run_uri else "run.output_dir"
    existing = cfg.run_dir
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    require(os.path.isdir(existing), f"{key}: {existing} is a file, not a folder, so the run cannot write "
                                     f"{cfg.run_dir}: give a folder as {key}, or move the file")
    try:
        probe = tempfile.NamedTemporaryFile(dir=existing, prefix=".lopd_ray_probe_")
        probe.close()
    except OSError as exc:
        raise ConfigError(f"{key}: the run cannot write in {existing} ({exc.strerror or exc}): give a folder this "
                          f"user can write as {key}, or fix its permissions") from None


def check_free_space(cfg: Config) -> None:
    """The run's disk must hold one more checkpoint as large as the newest the run has written (for a new run, any
    room at all): a full disk stops the command here, not at a checkpoint or in a start-up that waits on it."""
    existing = cfg.run_dir
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    root = os.path.join(cfg.run_dir, "checkpoints")
    steps = [int(n[len("step_"):]) for n in (os.listdir(root) if os.path.isdir(root) else [])
             if n.startswith("step_") and n[len("step_"):].isdigit()]
    newest = _bytes_under(os.path.join(root, f"step_{max(steps)}")) if steps else 0
    free = shutil.disk_usage(existing).free
    require(free > newest,
            f"the disk of {existing} has {free / 2**20:.1f} MiB free, "
            + (f"less than one checkpoint of this run takes ({newest / 2**20:.1f} MiB, step_{max(steps)})"
                if steps else "no room for the run's logs, metrics and checkpoints")
            + ": free space there (or lower run.keep_checkpoints), or give a run.output_dir on another disk")


def check_model_config(path: str, key: str) -> None:
    """A model directory's config.json must be JSON that transformers reads (a builtin model is the project's own;
    a directory without config.json is refused by the model's resolution)."""
    file = os.path.join(path, "config.json")
    if path.startswith(BUILTIN_PREFIX) or not os.path.isfile(file):
        return
    fix = "restore it from where the model came from, or save the model again with save_pretrained"
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as exc:
        raise ConfigError(f"{key}='{path}': config.json is not valid JSON ({exc}): {fix}") from None
    require(isinstance(config, dict) and isinstance(config.get("model_type"), str),
            f"{key}='{path}': config.json names no model_type (transformers reads the architecture from it): {fix}")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except Exception as exc:  # whatever transformers raises for a config it cannot read
        line = next((s.strip() for s in str(exc).splitlines() if s.strip()), type(exc).__name__)
        raise ConfigError(f"{key}='{path}': transformers cannot read its config.json ({line[:300]}): {fix}") from None


def check_bank_snapshot(directory: str, documents: str) -> None:
    """bank.init_path must be a whole snapshot (the one it replaced, while a snapshot is swapped in): its manifest,
    entries and vectors, as many of each, embedding bank.documents."""
    import numpy as np

    from lopd_ray.bank.bank import ENTRIES_FILE, MANIFEST_FILE, VECTORS_FILE
    from lopd_ray.utils.atomic import previous_path

    key = f"bank.init_path='{directory}'"
    rebuild = "rebuild it with `python -m lopd_ray.build_bank RECIPE.yaml --out DIR`"
    if not os.path.isfile(os.path.join(directory, MANIFEST_FILE)) and os.path.isdir(previous_path(directory)):
        directory = previous_path(directory)
    missing = [name for name in (MANIFEST_FILE, ENTRIES_FILE, VECTORS_FILE)
               if not os.path.isfile(os.path.join(directory, name))]
    require(not missing, f"{key} is not a whole bank snapshot: {', '.join(missing)} missing (a snapshot holds "
                          f"{MANIFEST_FILE}, {ENTRIES_FILE} and {VECTORS_FILE}): {rebuild}, or drop the key")
    try:
        with open(os.path.join(directory, MANIFEST_FILE)) as f:
            manifest = json.load(f)
        size, embeds = int(manifest["size"]), manifest["documents"]
        rows = np.load(os.path.join(directory, VECTORS_FILE), mmap_mode="r").shape[0]
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ConfigError(f"{key}: {MANIFEST_FILE} or {VECTORS_FILE} does not read ({exc}): {rebuild}") from None
    with open(os.path.join(directory, ENTRIES_FILE), "rb") as f:
        entries = sum(1 for line in f if line.strip())
    require(size == rows == entries, f"{key} is inconsistent: {entries} entries, {rows} vectors, manifest size "
                                      f"{size} (a snapshot cut short): {rebuild}")
    require(embeds == documents, f"{key} embeds documents '{embeds}' but bank.documents='{documents}': set "
                                  f"bank.documents={embeds}")


def check_bank_output(out: str) -> None:
    """build_bank's --out is replaced whole by the new snapshot: a new path, or an earlier snapshot to replace;
    never a file or a folder of other files, which would be lost."""
    from lopd_ray.bank.bank import MANIFEST_FILE

    require(not os.path.exists(out) or os.path.isdir(out),
            f"--out={out} is an existing file, and a bank snapshot is a directory: give a new directory path "
            f"(or an earlier snapshot, which is replaced)")
    require(not os.path.isdir(out) or not os.listdir(out) or os.path.isfile(os.path.join(out, MANIFEST_FILE)),
            f"--out={out} is a directory of other files, not a bank snapshot, and the snapshot replaces it whole: "
            f"give a new directory path (or an earlier snapshot, which is replaced)")
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    require(os.access(parent, os.W_OK), f"--out={out}: {parent} is not writable: give a directory path you can write")
