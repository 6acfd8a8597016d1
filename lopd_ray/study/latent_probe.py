"""`python -m lopd_ray.study.latent_probe RECIPE [key=value ...] --out FILE`: where LOPD's latents lose the example.

The gate's latents row says whether the cold-started composer's latents make the teacher better; this probe says
why not. Two readers give the frozen teacher's latent block its latents, each trained by METHOD 2.4's cold-start loss
alone (the NLL of the reference answer under the teacher given the latents, AdamW at `composer.cold_start_lr`,
batches of `composer.cold_start_batch_size`):
- `composer`: the recipe's composer (encoder LoRA + Perceiver resampler, METHOD 2.2), which must read the entries;
- `per_kind_table`: free latents per task kind (`task.meta["kind"]`), which read nothing: whether this loss can
  teach the teacher to read latents at all.
A composer that stays where the table moves has latents that depend too little on their entry for the loss to
reach it: the cold start's entry and regression phases (`composer.cold_start_entry_steps`) are for that case.
Every `steps // 5` steps each is measured on the held-out split (the first `eval.tasks`, retrieved from the train
split's seeded bank as in a run): the answers' NLL per token and the share answered exactly under teacher forcing
(every token of the reference answer is the teacher's argmax).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from lopd_ray.errors import ConfigError
from lopd_ray.startup import command
from lopd_ray.utils.atomic import write_file


@dataclass
class Example:
    messages: list[dict]
    entry_ids: list[list[int]]  # the retrieved entries' tokens
    answer_ids: list[int]       # the reference answer's, then end of sequence
    kind: str


class Probe:
    """The frozen teacher scoring reference answers after a latent block."""

    def __init__(self, cfg, model_dir: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lopd_ray.teacher.injection import latent_context

        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.model.requires_grad_(False)
        self.context = latent_context(cfg.composer)

    def examples(self, tasks, found) -> list[Example]:
        from lopd_ray.bank.traces import ComposerInputs
        from lopd_ray.study.gate import _kind

        inputs = ComposerInputs(self.cfg.composer, self.cfg.model.path)

        def encode(text: str) -> list[int]:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

        return [Example(tasks[i].messages, [encode(text) for text in inputs.texts(tasks[i].user_text, entries)],
                        encode(tasks.reference_solution(i)) + [self.tokenizer.eos_token_id], _kind(tasks[i]))
                for i, entries in enumerate(found) if entries]

    def nll_and_exact(self, batch: list[Example], latents: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
        """The batch's mean answer NLL per token (with its graph to the latents) and its share answered exactly."""
        from lopd_ray.teacher.injection import embed_with_latents, teacher_prompt_ids

        rows, spans, starts = [], [], []
        for ex, latents_Ld in zip(batch, latents):
            ids, span = teacher_prompt_ids(self.tokenizer, ex.messages, self.context, latents_Ld.shape[0],
                                           self.tokenizer.pad_token_id or 0)
            rows.append(ids + ex.answer_ids)
            spans.append(span)
            starts.append(len(ids))
        T = max(map(len, rows))
        ids_BT = torch.tensor([r + [0] * (T - len(r)) for r in rows])
        mask_BT = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
        logits = self.model(inputs_embeds=embed_with_latents(self.model, ids_BT, spans, latents),
                            attention_mask=mask_BT).logits
        nlls, exact = [], 0
        for b, (ex, start) in enumerate(zip(batch, starts)):
            logp_RV = torch.log_softmax(logits[b, start - 1:start - 1 + len(ex.answer_ids)].float(), dim=-1)
            answer = torch.tensor(ex.answer_ids)
            nlls.append(-logp_RV.gather(1, answer[:, None]).mean())
            exact += bool((logp_RV.argmax(-1) == answer).all())
        return torch.stack(nlls).mean(), exact / len(batch)


def composer_reader(probe: Probe, model_dir: str, kinds: list[str], num_latents: int):
    from transformers import AutoModelForCausalLM

    from lopd_ray.teacher.composer import Composer

    composer = Composer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), probe.cfg.composer)
    return (lambda batch: composer.latents([ex.entry_ids for ex in batch])), list(composer.phi_parameters())


def per_kind_reader(probe: Probe, model_dir: str, kinds: list[str], num_latents: int):
    from lopd_ray.teacher.composer import token_embedding_rms

    scale = token_embedding_rms(probe.model)
    table = nn.ParameterDict({k: nn.Parameter(torch.randn(num_latents, probe.model.config.hidden_size) * scale)
                              for k in kinds})
    return (lambda batch: [table[ex.kind] for ex in batch]), list(table.parameters())


# name -> builder(probe, model_dir, kinds, latents per task) -> (batch of examples -> their latents, parameters)
READERS = {"composer": composer_reader, "per_kind_table": per_kind_reader}


def train_reader(name: str, probe: Probe, model_dir: str, train: list[Example], held_out: list[Example],
                 steps: int, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    num_latents = probe.cfg.bank.top_j * probe.cfg.composer.num_queries
    reader, params = READERS[name](probe, model_dir, sorted({ex.kind for ex in train}), num_latents)
    optimizer = torch.optim.AdamW(params, lr=probe.cfg.composer.cold_start_lr)
    order, curve = random.Random(seed), []

    def measure(step: int) -> None:
        with torch.no_grad():
            nll, exact = probe.nll_and_exact(held_out, reader(held_out))
        curve.append({"step": step, "held_out_nll": float(nll), "held_out_exact": exact})
        print(f"{name}: step {step}, held-out NLL {float(nll):.3f}, exact {exact:.3f}", flush=True)

    measure(0)
    for step in range(1, steps + 1):
        batch = order.sample(train, min(probe.cfg.composer.cold_start_batch_size, len(train)))
        nll, _ = probe.nll_and_exact(batch, reader(batch))
        optimizer.zero_grad()
        nll.backward()
        torch.nn.utils.clip_grad_norm_(params, probe.cfg.composer.cold_start_compressor_grad_clip)
        optimizer.step()
        if step % max(steps // 5, 1) == 0 or step == steps:
            measure(step)
    return curve


def run_probe(recipe: str, overrides: list[str], steps: int, readers: list[str], seed: int = 0) -> dict:
    from lopd_ray.config import load_config
    from lopd_ray.envs import make_env
    from lopd_ray.models import resolve_model_path
    from lopd_ray.study.gate import _Head, retrieve

    unknown = [name for name in readers if name not in READERS]
    if unknown:
        raise ConfigError(f"unknown reader {unknown[0]!r}; the readers are {', '.join(READERS)}")
    cfg = load_config(recipe, overrides)
    model_dir = resolve_model_path(cfg.model.path)
    _, train_tasks = make_env(cfg.env)
    _, held_tasks = make_env(cfg.held_out_env)
    train_head = _Head(train_tasks, min(cfg.bank.seed_references, len(train_tasks)))
    held_head = _Head(held_tasks, min(cfg.eval.tasks or len(held_tasks), len(held_tasks)))
    probe = Probe(cfg, model_dir)
    train = probe.examples(train_head, retrieve(cfg, train_head, train_tasks))
    held_out = probe.examples(held_head, retrieve(cfg, held_head, train_tasks))
    started = time.monotonic()
    curves = {name: train_reader(name, probe, model_dir, train, held_out, steps, seed) for name in readers}
    return {"recipe": recipe, "overrides": overrides, "model": cfg.model.path, "steps": steps,
            "train_examples": len(train), "held_out_examples": len(held_out),
            "latents_per_task": cfg.bank.top_j * cfg.composer.num_queries, "lr": cfg.composer.cold_start_lr,
            "readers": curves, "seconds": time.monotonic() - started}


def latent_probe(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.study.latent_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--out", required=True, help="the JSON file the curves are written to")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--readers", default=",".join(READERS), help=f"a comma list of {', '.join(READERS)}")
    args = parser.parse_intermixed_args(argv)
    torch.set_num_threads(1)
    result = run_probe(args.recipe, args.overrides, args.steps, args.readers.split(","))
    write_file(args.out, json.dumps(result, indent=1) + "\n")
    print(f"latent probe: {args.out}", flush=True)
    return 0


main = command(latent_probe)

if __name__ == "__main__":
    sys.exit(main())
