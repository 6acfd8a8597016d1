"""A study's gate: before any training, is the base model's teacher better than its student *because of what its
context says*?

On the held-out split (greedy, the study's `eval.tasks`), the base model is scored
- alone (the student);
- with the task's own solution in each method's framing and placement (lopd_ray.teacher.framings);
- with a retrieved same-kind experience: the bank's top entry (MiniLM + faiss over the train split's seeded
  reference solutions, never the task itself) as text in LOPD's and OP2SD's framings, and as LOPD's latents
  from the cold-started composer when the spec's LOPD recipe has a cold start;
- with another kind's solution in each framing (the control: content that should mislead), and as LOPD's latents
  from as many of that kind's entries as a task retrieves, composed for that kind's task (as the text rows show
  the other task too: a composer that reads the current task could otherwise answer it from its own weights; the
  task's own text with those entries is reported beside it, what such a composer knows without the entries);
- with each framing holding nothing.
Per context: the held-out reward of a greedy episode (multi-turn envs: the env's replies are appended and the
context stays where it was placed), and KL(teacher || student) per token over the student's own greedy turns. The
checks: own and retrieved beat alone by `gate.margin`; another kind's solution stays `gate.margin` below them.
A kind is `task.meta["kind"]`; an env without kinds cannot be gated.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from lopd_ray.data.trajectory import TeacherContext
from lopd_ray.errors import ConfigError
from lopd_ray.utils.atomic import write_file

GATE_TEXT_RETRIEVED = ("lopd_text", "op2sd")
LATENTS_ROW = "retrieved same kind, lopd latents"
# The first answers under each context kept in gate.json, to read what a score of 0 or 1 was made of.
EXAMPLE_ANSWERS = 3


@dataclass
class GateSpec:
    # A spec on an env without kinds (code, envscaler) cannot be gated: it says so and is no method evidence.
    enabled: bool = True
    # The margin (held-out reward) by which the teacher with the task's or a same-kind solution must beat the
    # student alone, and by which another kind's solution must stay below them.
    margin: float = 0.2
    # Also score LOPD's latents (a cold start of the spec's `lopd` method, composer.cold_start_steps of its recipe).
    latents: bool = True
    # The latents' row joins the checks (false: reported only).
    check_latents: bool = False
    # The latents' row must also stay `margin` below the task's own solution: the cold-started composer leaves a
    # learned one room to do better (true for a testbed built for that question).
    check_room: bool = False


@dataclass
class Probe:
    """One held-out task under one context: its teacher context, and latent texts for LOPD's latent block."""
    context: Optional[TeacherContext]
    latent_texts: list[str] = field(default_factory=list)


def _kind(task) -> str:
    if "kind" not in task.meta:
        raise ConfigError(f"the gate needs tasks that name their kind (task.meta['kind']); {task.task_id} does not: "
                          f"gate a spec on an env with kinds such as env.name=rules")
    return task.meta["kind"]


def seeded_bank(cfg, train):
    """The bank a run starts from: the train split's first bank.seed_references reference solutions."""
    from lopd_ray.bank.bank import ExperienceBank
    from lopd_ray.bank.seeding import reference_entries

    bank = ExperienceBank(cfg.bank)
    first = range(min(max(cfg.bank.seed_references, 64), len(train)))
    bank.add(reference_entries(train, [i for i in first if train.reference_solution(i) is not None], cfg.bank))
    return bank


def retrieve(cfg, held_out, train) -> list[list]:
    """Each held-out task's top `bank.top_j` entries of the seeded bank (never the task itself)."""
    return seeded_bank(cfg, train).retrieve([t.user_text for t in held_out], max(cfg.bank.top_j, 1),
                                            [t.task_id for t in held_out])


def probes(cfg, held_out, train, found: list[list], with_latents: bool) -> dict[str, list[Probe]]:
    """Every context of the gate, per held-out task (in order); `found`: each task's retrieved entries."""
    from lopd_ray.bank.seeding import reference_entries
    from lopd_ray.bank.traces import ComposerInputs
    from lopd_ray.teacher.framings import FRAMINGS
    from lopd_ray.teacher.injection import latent_context

    rng, latent_rng = random.Random("gate"), random.Random("gate latents")
    inputs = ComposerInputs(cfg.composer, cfg.model.path)
    by_kind: dict[str, list[int]] = {}
    for i in range(len(train)):  # the tasks with a solution to show
        if train.reference_solution(i) is not None:
            by_kind.setdefault(_kind(train[i]), []).append(i)
    rows: dict[str, list[Probe]] = {"alone": [Probe(None)] * len(held_out)}
    for index, task in enumerate(held_out):
        own = (task.user_text, held_out.reference_solution(index))
        other_kind = rng.choice([k for k in sorted(by_kind) if k != _kind(task)])
        j = rng.choice(by_kind[other_kind])
        other = (train[j].user_text, train.reference_solution(j))
        entries = found[index]
        for name, framing in FRAMINGS.items():
            rows.setdefault(f"own solution, {name}", []).append(Probe(framing(cfg, *own)))
            rows.setdefault(f"other kind's solution, {name}", []).append(Probe(framing(cfg, *other)))
            rows.setdefault(f"empty framing, {name}", []).append(Probe(framing(cfg, "", "")))
        for name in GATE_TEXT_RETRIEVED:
            solution = entries[0].trace_text.removeprefix("Action: ") if entries else ""
            rows.setdefault(f"retrieved same kind, {name}", []).append(
                Probe(FRAMINGS[name](cfg, entries[0].task_text, solution) if entries else None))
        if with_latents:
            rows.setdefault(LATENTS_ROW, []).append(
                Probe(latent_context(cfg.composer), inputs.texts(task.user_text, entries)))
            more = latent_rng.sample([i for i in by_kind[other_kind] if i != j], max(len(entries), 1) - 1)
            misleading = reference_entries(train, [j, *more], cfg.bank)
            rows.setdefault("other kind's solution, lopd latents", []).append(
                Probe(latent_context(cfg.composer), inputs.texts(other[0], misleading)))
            # reported, not checked: what a composer that reads the task gives it from another kind's entries
            rows.setdefault("the task with another kind's entries, lopd latents", []).append(
                Probe(latent_context(cfg.composer), inputs.texts(task.user_text, misleading)))
    return rows


def retrieval_precision(found: list[list], held_out, train) -> float:
    """The share of held-out tasks whose top retrieved entry is of their own kind."""
    kinds = {t.user_text: _kind(t) for t in (train[i] for i in range(len(train)))}
    return float(np.mean([bool(f) and kinds.get(f[0].task_text) == _kind(t) for f, t in zip(found, held_out)]))


def cold_started_phi(run, out_dir: str) -> tuple[str, dict]:
    """phi_0 of the spec's LOPD run (`python -m lopd_ray.cold_start` with that run's recipe and overrides) and the
    cold start's NLL of the reference answers, first and last step."""
    path = os.path.join(out_dir, "gate_phi0.pt")
    log = os.path.join(out_dir, "gate_cold_start.log")
    written = os.path.join(out_dir, "gate_cold_start", "cold_start.json")  # what the command writes in its run dir
    if not (os.path.exists(path) and os.path.exists(written)):
        overrides = [o for o in run.overrides if not o.startswith(("run.", "train.seed"))]
        with open(log, "w") as f:
            code = subprocess.run([sys.executable, "-m", "lopd_ray.cold_start", run.recipe, "--out", path,
                                   *overrides, f"run.output_dir={out_dir}", "run.name=gate_cold_start"],
                                  stdout=f, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise ConfigError(f"the gate's composer cold start failed (exit {code}): see {log}")
    with open(written) as f:
        summary = json.load(f)
    return path, {k.removeprefix("cold_start/"): v for k, v in summary.items() if k.startswith("cold_start/")}


class Scorer:
    """The base model (and, for latents, the composer around it) scoring held-out tasks greedily under contexts."""

    def __init__(self, cfg, model_dir: str, phi_path: Optional[str]):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.composer = None
        if phi_path:
            from lopd_ray.teacher.composer import Composer

            self.composer = Composer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                     cfg.composer).eval()
            self.composer.load_phi_state_dict(torch.load(phi_path, weights_only=True))
        self.placeholder_id = self.tokenizer.pad_token_id or 0

    def _context(self, probe: Probe):
        """The probe's teacher context and the latents [L, d] for its latent slot (none for a text context)."""
        import torch

        context = probe.context or TeacherContext("", "user_suffix")
        if probe.latent_texts:
            entry_ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in probe.latent_texts]
            return context, self.composer.latents([entry_ids])[0]
        return context, torch.zeros(0, self.model.config.hidden_size)

    def _embeds(self, messages: list[dict], probe: Probe):
        """The input embeddings [1, T, d] of the conversation's next turn under the probe's context."""
        from lopd_ray.teacher.greedy import prompt_embeds

        return prompt_embeds(self.model, self.tokenizer, messages, *self._context(probe), self.placeholder_id)

    def play(self, task, probe: Probe, new_env):
        """A greedy episode of the env under the probe's context (lopd_ray/teacher/greedy.py)."""
        from lopd_ray.teacher.greedy import greedy_episode

        return greedy_episode(self.model, self.tokenizer, task, new_env, *self._context(probe),
                              self.cfg.rollout.max_new_tokens, self.placeholder_id)

    def logprobs(self, messages: list[dict], probe: Probe, response: list[int]):
        """[R, V] log-probabilities of the response's tokens' positions after `messages` under `probe`."""
        import torch

        prompt = self._embeds(messages, probe)
        embeds = torch.cat([prompt, self.model.get_input_embeddings()(torch.tensor([response]))], dim=1)
        logits = self.model(inputs_embeds=embeds).logits[0, prompt.shape[1] - 1:-1]
        return torch.log_softmax(logits.float(), dim=-1)


def score(cfg, model_dir: str, rows: dict[str, list[Probe]], held_out, phi_path: Optional[str]) -> dict[str, dict]:
    """Per context: held-out reward (mean, greedy), KL(teacher || student) per token on the student's answers, and
    the first answers."""
    import torch

    from lopd_ray.envs import make_env

    new_env, _ = make_env(cfg.held_out_env)
    scorer = Scorer(cfg, model_dir, phi_path)
    with torch.no_grad():
        students = [scorer.play(task, Probe(None), new_env) for task in held_out]
        student_logps = [[scorer.logprobs(m, Probe(None), ids) for m, ids in s.turns] for s in students]
        results = {}
        for name, probes_of in rows.items():
            rewards, kls, texts = [], [], []
            for task, probe, student, student_logp in zip(held_out, probes_of, students, student_logps):
                episode = scorer.play(task, probe, new_env)
                rewards.append(episode.reward)
                texts.append("\n".join(episode.texts))
                teacher_logp = torch.cat([scorer.logprobs(m, probe, ids) for m, ids in student.turns])
                student_logp = torch.cat(student_logp)
                kls.append(float((teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1).mean()))
            results[name] = {"reward": float(np.mean(rewards)), "kl_teacher_student": float(np.mean(kls)),
                             "answers": texts[:EXAMPLE_ANSWERS]}
    return results


def checks(results: dict[str, dict], margin: float, check_latents: bool, check_room: bool = False) -> list[dict]:
    """The gate's pass/fail lines: every own-solution and retrieved row beats alone by `margin`; the best other-kind
    row stays `margin` below the worst of them (latent rows count only with `check_latents`); with `check_room`, the
    retrieved latents' row stays `margin` below the worst own-solution row."""
    alone = results["alone"]["reward"]
    informative = {n: r["reward"] for n, r in results.items() if n.startswith(("own solution", "retrieved"))
                   and (check_latents or "latents" not in n)}
    out = [{"check": f"{n} >= alone + {margin}", "value": v - alone, "passed": v - alone >= margin}
           for n, v in informative.items()]
    worst = min(informative.values())
    misleading = max(r["reward"] for n, r in results.items() if n.startswith("other kind")
                     and (check_latents or "latents" not in n))
    out.append({"check": f"other kind's solution (best) <= own/retrieved (worst) - {margin}",
                "value": worst - misleading, "passed": worst - misleading >= margin})
    if check_room:
        own = min(r["reward"] for n, r in results.items() if n.startswith("own solution"))
        room = own - results[LATENTS_ROW]["reward"]
        out.append({"check": f"{LATENTS_ROW} <= own solution (worst) - {margin}", "value": room,
                    "passed": room >= margin})
    return out


def markdown(gate: dict) -> str:
    cold = gate.get("cold_start")
    phases = (f"entry latents' NLL {cold['entry_nll_first']:.3f} -> {cold['entry_nll_last']:.3f}, the composer's "
              f"regression onto them {cold['regression_first']:.3f} -> {cold['regression_last']:.3f}, then "
              if cold and "entry_nll_first" in cold else "")
    lines = [f"Gate of {gate['name']}: {gate['tasks']} held-out tasks, greedy, base model {gate['model']}; "
             f"top retrieved entry of the task's own kind: {gate['retrieval_same_kind']:.2f}"
             + (f"; composer cold start: {phases}NLL of the reference answers {cold['nll_first']:.3f} -> "
                f"{cold['nll_last']:.3f}" if cold else "")
             + (f"; measured in {gate['seconds']:.0f} s" if "seconds" in gate else ""), "",
             "| context | held-out reward | KL(teacher ‖ student) per token |", "|---|---|---|"]
    lines += [f"| {n} | {r['reward']:.3f} | {r['kl_teacher_student']:.3f} |" for n, r in gate["contexts"].items()]
    lines += ["", "| check | value | passed |", "|---|---|---|"]
    lines += [f"| {c['check']} | {c['value']:+.3f} | {'yes' if c['passed'] else 'NO'} |" for c in gate["checks"]]
    lines.append(f"\nGate {'passed' if gate['passed'] else 'FAILED'}.")
    return "\n".join(lines) + "\n"


def run_gate(spec, runs, out_dir: str) -> dict:
    """Measures the gate for the spec's runs (their common model, env and held-out split) and writes gate.json and
    gate.md into `out_dir`."""
    from lopd_ray.config import load_config
    from lopd_ray.envs import make_env
    from lopd_ray.models import resolve_model_path

    first = runs[0]
    cfg = load_config(first.recipe, list(first.overrides))
    model_dir = resolve_model_path(cfg.model.path)
    _, held = make_env(cfg.held_out_env)
    _, train = make_env(cfg.env)
    count = min(cfg.eval.tasks or len(held), len(held))
    held_out = _Head(held, count)
    lopd = next((r for r in runs if load_config(r.recipe, list(r.overrides)).context.name == "latent"), None)
    phi, cold_start = None, {}
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    if spec.gate.latents and lopd is not None:
        phi, cold_start = cold_started_phi(lopd, out_dir)
        cfg = load_config(lopd.recipe, list(lopd.overrides))  # the composer's settings
    found = retrieve(cfg, held_out, train)
    results = score(cfg, model_dir, probes(cfg, held_out, train, found, phi is not None), held_out, phi)
    gate_checks = checks(results, spec.gate.margin, spec.gate.check_latents, spec.gate.check_room)
    gate = {"name": spec.name, "model": cfg.model.path, "tasks": count,
            "retrieval_same_kind": retrieval_precision(found, held_out, train), "margin": spec.gate.margin,
            "cold_start": cold_start, "contexts": results, "checks": gate_checks,
            "passed": all(c["passed"] for c in gate_checks), "seconds": time.monotonic() - started}
    write_file(os.path.join(out_dir, "gate.json"), json.dumps(gate, indent=1) + "\n")
    write_file(os.path.join(out_dir, "gate.md"), markdown(gate))
    return gate


class _Head:
    """The first `count` tasks of a task source."""

    def __init__(self, tasks, count: int):
        self.source, self.count = tasks, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        if not 0 <= index < self.count:
            raise IndexError(index)
        return self.source[index]

    def __iter__(self):
        return (self.source[i] for i in range(self.count))

    def reference_solution(self, index: int):
        return self.source.reference_solution(index)
