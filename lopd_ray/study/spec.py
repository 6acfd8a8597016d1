"""A study's spec (YAML, typed here) and the runs it expands to.

Every run is `python -m lopd_ray.train RECIPE key=value ...`: the arm's recipe, then `eval.teacher=true` where its
method has a teacher (the teacher's held-out reward beside the student's), the spec's `common` overrides (the shared
generation budget and the held-out evaluation), the scale's, the arm's own, --quick's, the seed and the run's
directory. All runs are checked to load before the first starts, and to share one generation budget.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lopd_ray.algorithms import ALGORITHMS
from lopd_ray.config import Config, load_config
from lopd_ray.errors import ConfigError
from lopd_ray.preflight import check_registries, check_unread_keys
from lopd_ray.study.gate import GateSpec


@dataclass
class Method:
    recipe: str
    overrides: list[str] = field(default_factory=list)


@dataclass
class Ablation:
    method: str                                   # a key of `methods`: its recipe and overrides come first
    overrides: list[str] = field(default_factory=list)


@dataclass
class Quick:
    arms: list[str] = field(default_factory=list)   # the methods and ablations that --quick runs
    seeds: list[int] = field(default_factory=lambda: [1])
    overrides: list[str] = field(default_factory=list)


@dataclass
class StudySpec:
    name: str
    methods: dict[str, Method]
    description: str = ""
    common: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    ablations: dict[str, Ablation] = field(default_factory=dict)
    # Runs that test whether the context's content matters (another kind's solution, an empty framing).
    controls: dict[str, Ablation] = field(default_factory=dict)
    ablation_seeds: list[int] = field(default_factory=lambda: [1])
    gate: GateSpec = field(default_factory=GateSpec)
    quick: Quick = field(default_factory=Quick)
    # --scale NAME adds scales[NAME]'s overrides to every run; "cpu" (the recipes as they are) needs no entry.
    scales: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    arm: str
    kind: str          # "method" or "ablation"
    seed: int
    recipe: str
    overrides: tuple[str, ...]

    @property
    def command(self) -> list[str]:
        return ["-m", "lopd_ray.train", self.recipe, *self.overrides]


# A spec may list its methods by name: each is then its shipped CPU recipe, on one generation budget (the schema's
# train.total_steps, prompts_per_step, samples_per_prompt and rollout.max_new_tokens) evaluated held out every
# EVAL_EVERY_STEPS updates, unless the spec's `common` overrides (the user's env and model) say otherwise.
SHIPPED_RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               "recipes")
EVAL_EVERY_STEPS = 10


def by_name(raw) -> None:
    """`methods: [grpo, opsd, lopd]` in `raw` (the spec's YAML) made into the methods' shipped recipes."""
    names = raw.get("methods")
    if not OmegaConf.is_list(names):
        return
    recipes = {os.path.basename(p).split("_")[0]: p for p in sorted(os.listdir(SHIPPED_RECIPES))
               if p.endswith("_letters_cpu.yaml")}
    unknown = [n for n in names if n not in recipes]
    if unknown:
        raise ConfigError(f"study spec: methods {unknown} have no shipped recipe: choose among {sorted(recipes)}, or "
                          f"give each method a recipe (methods: {{name: {{recipe: PATH}}}})")
    raw.methods = {n: {"recipe": os.path.join(SHIPPED_RECIPES, recipes[n])} for n in names}
    train, rollout = Config().train, Config().rollout
    budget = [f"train.total_steps={train.total_steps}", f"train.prompts_per_step={train.prompts_per_step}",
              f"train.samples_per_prompt={train.samples_per_prompt}",
              f"rollout.max_new_tokens={rollout.max_new_tokens}"]
    raw.common = [*budget, f"eval.every_steps={EVAL_EVERY_STEPS}", *raw.get("common", [])]


def load_spec(path: str) -> StudySpec:
    if not os.path.isfile(path):
        raise ConfigError(f"study spec '{path}' not found: give a YAML file such as recipes/studies/rules.yaml")
    try:
        raw = OmegaConf.load(path)
        by_name(raw)
        spec: StudySpec = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(StudySpec), raw))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"study spec {path}: {str(exc).splitlines()[0]} (the fields are those of "
                          f"lopd_ray/study/spec.py)") from None
    for name, ablation in {**spec.ablations, **spec.controls}.items():
        if ablation.method not in spec.methods:
            raise ConfigError(f"study spec {path}: arm '{name}' extends method '{ablation.method}', which is not "
                              f"one of methods {sorted(spec.methods)}")
    unknown = [a for a in spec.quick.arms if a not in {**spec.methods, **spec.ablations, **spec.controls}]
    if unknown:
        raise ConfigError(f"study spec {path}: quick.arms {unknown} are neither methods, ablations nor controls")
    for name, method in spec.methods.items():
        method.recipe = os.path.normpath(os.path.join(os.path.dirname(path), method.recipe))
    return spec


def plan_runs(spec: StudySpec, runs_dir: str, quick: bool = False, scale: str = "cpu") -> list[RunSpec]:
    """The grid: every method x `seeds`, then every ablation and control x `ablation_seeds` (--quick: quick.arms x
    quick.seeds)."""
    if scale != "cpu" and scale not in spec.scales:
        raise ConfigError(f"--scale {scale}: the spec {spec.name} has the scales {['cpu', *sorted(spec.scales)]}")
    arms = [(name, "method", spec.methods[name], []) for name in spec.methods]
    arms += [(name, "ablation", spec.methods[a.method], a.overrides) for name, a in spec.ablations.items()]
    arms += [(name, "control", spec.methods[a.method], a.overrides) for name, a in spec.controls.items()]
    runs = []
    for name, kind, method, extra in arms:
        if quick and name not in spec.quick.arms:
            continue
        seeds = spec.quick.seeds if quick else spec.seeds if kind == "method" else spec.ablation_seeds
        arm_overrides = (*spec.common, *spec.scales.get(scale, []), *method.overrides, *extra,
                         *(spec.quick.overrides if quick else []))
        watched = teacher_watched(method.recipe, arm_overrides)
        for seed in seeds:
            run_id = f"{name}-s{seed}"
            overrides = (*watched, *arm_overrides, f"train.seed={seed}",
                         f"run.output_dir={os.path.abspath(runs_dir)}", f"run.name={run_id}", "run.resume=auto",
                         "run.progress_bar=false")
            runs.append(RunSpec(run_id, name, kind, seed, method.recipe, overrides))
    return runs


def teacher_watched(recipe: str, overrides: tuple[str, ...]) -> tuple[str, ...]:
    """`eval.teacher=true` for an arm whose method has a teacher; it goes before the spec's overrides, which may
    set it otherwise."""
    try:
        cfg = load_config(recipe, overrides)
    except ConfigError:
        return ()  # check_runs names the run and its error
    algorithm = ALGORITHMS.get(cfg.algorithm.name)
    return ("eval.teacher=true",) if algorithm is not None and algorithm.needs_teacher else ()


def generation_budget(cfg: Config) -> dict[str, int]:
    t = cfg.train
    return {"episodes": t.total_steps * t.prompts_per_step * t.samples_per_prompt,
            "max_new_tokens": cfg.rollout.max_new_tokens, "refill_rounds": cfg.algorithm.grpo.refill_rounds}


def check_runs(runs: list[RunSpec]) -> tuple[dict[str, int], dict[str, int]]:
    """Every run's config loads and is consistent, evaluates held out, and all runs share one generation budget
    (episodes sampled, tokens per turn). Returns the budget and each run's train.total_steps."""
    budgets, total_steps = {}, {}
    for run in runs:
        try:
            cfg = load_config(run.recipe, run.overrides)
            check_registries(cfg)
            check_unread_keys(cfg)
        except ConfigError as exc:
            raise ConfigError(f"study run {run.run_id}: {exc}") from None
        if cfg.eval.every_steps <= 0:
            raise ConfigError(f"study run {run.run_id}: eval.every_steps=0, so it would write no held-out curve: "
                              f"set eval.every_steps in the spec's `common` overrides")
        budgets[run.run_id] = generation_budget(cfg)
        total_steps[run.run_id] = cfg.train.total_steps
    first = next(iter(budgets.values()))
    differing = {run_id: b for run_id, b in budgets.items() if b != first}
    if differing:
        run_id, budget = next(iter(differing.items()))
        raise ConfigError(f"study runs do not share one generation budget: {runs[0].run_id} has {first}, {run_id} "
                          f"{budget}; set train.* and rollout.max_new_tokens in the spec's `common` overrides")
    return first, total_steps
