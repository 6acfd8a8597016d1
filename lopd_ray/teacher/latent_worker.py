"""LatentTeacherWorker: the self-teacher of LOPD, whose context is latent tokens that the composer phi composes from
the retrieved experience, and the composer's margin-constrained step (METHOD 2.3-2.5)."""
from __future__ import annotations

import io
import math
import os
from typing import Iterator, NamedTuple

import ray
import torch

from lopd_ray.algorithms.lopd import answer_nll, composer_terms, outcome_sign, regression_loss
from lopd_ray.data.by_reference import fetch_arrays
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.modeling.logprobs import hidden_logprobs
from lopd_ray.modeling.train_engine import adamw_engine, deepspeed_config, gradient_norm
from lopd_ray.teacher.composer import token_embedding_rms
from lopd_ray.teacher.injection import latent_context
from lopd_ray.teacher.worker import TeacherWorker
from lopd_ray.utils.atomic import write_file


class ScoringPass(NamedTuple):
    """A micro-batch's scoring forward pass with its graph through phi, kept for the composer's step."""
    group: list[Trajectory]
    hidden: torch.Tensor  # [B, R, d]
    head: torch.nn.Module
    latents: list[torch.Tensor]


class EntryLatents(torch.nn.Module):
    """[E, K, d] free latents, E entries all starting from `start` [K, d]: the cold start's regression targets."""

    def __init__(self, start: torch.Tensor, entries: int):
        super().__init__()
        self.latents = torch.nn.Parameter(start.expand(entries, *start.shape).clone())


class LatentTeacherWorker(TeacherWorker):
    """Ranks train the composer data-parallel (DeepSpeed averages phi's gradients; the margin's statistics are summed
    over ranks, so the driver's dual ascent sees the whole batch). The step's maths and beta are the LOPD
    algorithm's (lopd_ray/algorithms/lopd.py); this actor runs the forwards, the backward and the optimizer step."""

    def __init__(self, cfg, model_path: str, *args, **kwargs):
        super().__init__(cfg, model_path, *args, **kwargs)
        from lopd_ray.teacher.composer import Composer

        self.comp_cfg = cfg.composer
        torch.manual_seed(cfg.train.seed)  # phi's initialization is part of the run's configuration
        self.composer = Composer(self.backbone, self.comp_cfg).to(self.device)
        if self.comp_cfg.init_path:
            self.composer.load_phi_state_dict(torch.load(self.comp_cfg.init_path, weights_only=True))
        self._broadcast_phi()  # every rank of the group starts from rank 0's phi
        self.engine = adamw_engine(self.composer, list(self.composer.phi_parameters()), self.comp_cfg.lr,
                                   deepspeed_config(self.comp_cfg.grad_clip))
        self.phi0 = self._phi_copy()
        # c_phi0 per composer input text: per entry, or per (task, entry) with composer.input=current_task
        self.anchor_latents: dict[str, torch.Tensor] = {}
        self.skipped_phi_steps = 0  # non-finite gradient norms, over the run
        # With LoRA dropout the step's forward pass (training mode) differs from the scoring one (evaluation mode).
        # Sharded ranks pass in lockstep, which a backward on kept passes (as many as each rank's scoring had) breaks.
        self.reuses_scoring_pass = (self.comp_cfg.reuse_scoring_pass and self.comp_cfg.lora_dropout == 0
                                    and "composer" in self.algorithm.teacher_steps() and not self.sharded)
        self.keeping_passes = False
        self.scoring_passes: list[ScoringPass] = []  # of the last scoring, until the composer's step

    # ---- the latent context ----------------------------------------------------------------------------------
    def _teacher_model(self):
        return self.composer.teacher_model()

    def _num_latents(self, t: Trajectory) -> int:
        return len(t.retrieved_ids or ()) * self.comp_cfg.num_queries

    def _phi_copy(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.composer.phi_state_dict().items()}

    def _idle_trajectory(self) -> Trajectory:
        t = super()._idle_trajectory()
        t.teacher_context, t.retrieved_ids, t.retrieved_texts = latent_context(self.comp_cfg), ["idle"], ["idle"]
        return t

    def _tokens(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"][:self.comp_cfg.max_entry_tokens]

    def _entry_ids(self, t: Trajectory) -> list[list[int]]:
        return [self._tokens(text) for text in t.retrieved_texts]

    def _latents(self, trajs: list[Trajectory]) -> list[torch.Tensor]:
        """c_phi per trajectory, [J*K, d]; trajectories with the same composer inputs (a task's samples) share one
        encoding, and so its gradient."""
        keys = [tuple(t.retrieved_texts) for t in trajs]
        first: dict[tuple, Trajectory] = {}
        for key, t in zip(keys, trajs):
            first.setdefault(key, t)
        encoded = dict(zip(first, self.composer.latents([self._entry_ids(t) for t in first.values()])))
        return [encoded[key] for key in keys]

    def _anchors(self, trajs: list[Trajectory]) -> None:
        """Caches c_phi0, the latents of the cold-start composer, for composer inputs not seen before (all of a
        batch's new ones in one encoding)."""
        new: dict[str, list[int]] = {}
        for t in trajs:
            for text in t.retrieved_texts:
                if text not in self.anchor_latents and text not in new:
                    new[text] = self._tokens(text)
        if self.sharded and self._max_over_ranks([len(new)])[0] > 0 and not new:
            new = {None: [self.placeholder_id]}  # encodes with the ranks that have new entries
        if not new:
            return
        current = self._phi_copy()
        self.composer.load_phi_state_dict(self.phi0)
        with torch.no_grad():
            for entry, latents_Kd in zip(new, self.composer.encode(list(new.values()))):
                if entry is not None:
                    self.anchor_latents[entry] = latents_Kd.clone()
        self.composer.load_phi_state_dict(current)

    def score(self, trajs, with_hidden=False):
        self._anchors([t for t in trajs if t.teacher_context is not None])
        return super().score(trajs, with_hidden)

    @ray.method(num_returns=2)
    def teacher_scores(self, trajs: list[Trajectory], with_hidden: bool = False) -> tuple[dict, dict]:
        """The scoring the composer's step follows; its forward passes are kept for that step."""
        self.scoring_passes, self.keeping_passes = [], self.reuses_scoring_pass
        try:
            return super().teacher_scores(trajs, with_hidden)
        finally:
            self.keeping_passes = False

    def _scoring_pass(self, group: list[Trajectory]):
        if not self.keeping_passes:
            return super()._scoring_pass(group)
        with torch.enable_grad():
            kept = self._new_pass(group)
        self.scoring_passes.append(kept)
        return kept.hidden.detach(), kept.head

    def _step_passes(self, trajs: list[Trajectory]) -> tuple[int, Iterator[ScoringPass]]:
        """How many forward passes the composer's step on `trajs` takes, and the passes one at a time: the kept
        scoring passes where they cover exactly these trajectories (phi has not moved since), else new ones."""
        kept, self.scoring_passes = self.scoring_passes, []
        if sorted(t.uid for p in kept for t in p.group) == sorted(t.uid for t in trajs):
            step_trajs = {t.uid: t for t in trajs}  # the same trajectories, with the student's arrays attached
            return len(kept), (p._replace(group=[step_trajs[t.uid] for t in p.group]) for p in kept)
        groups = self._micro_batches(trajs)
        return len(groups), (self._new_pass(group) for group in groups)

    def _new_pass(self, group: list[Trajectory]) -> ScoringPass:
        latents = self._latents(group)
        return ScoringPass(group, *self._padded_hidden(group, latents), latents)

    # ---- the composer's step -------------------------------------------------------------------------------
    def update_composer(self, trajs: list[Trajectory], beta: float, margin: float) -> dict[str, float]:
        """One AdamW step on phi: KL to the pre-update student + beta * (margin - the outcome-signed advantage) +
        anchor (the driver's dual ascent moves beta from the advantage measured here, lopd/delta). Each trajectory
        carries the pre-update student log-probs (`student_logprobs`, `student_topm_logprobs`). Every rank is called,
        with its shard (maybe empty); losses are means over the trajectories of all ranks."""
        fetch_arrays(trajs)
        trajs = [t for t in trajs if t.retrieved_ids and t.student_logprobs is not None]
        self._anchors(trajs)
        total = int(self._sum_over_ranks([len(trajs)])[0])
        if total == 0:
            return {}
        scale = self.world_size / total  # DeepSpeed averages gradients over ranks
        self.engine.train()
        signed_delta_sum, tokens, kl_sum, gap_sum = 0.0, 0.0, 0.0, 0.0
        count, passes = self._step_passes(trajs)
        most, chunks = self._most_passes(count, trajs)
        if not trajs and not self.sharded:  # this rank still joins the gradient all-reduce
            self.engine.set_gradient_accumulation_boundary(True)
            self.engine.backward(sum(p.sum() for p in self.composer.phi_parameters()) * 0.0)
        for k, (group, hidden, head, latents) in enumerate(passes):
            self.engine.set_gradient_accumulation_boundary(k == most - 1)
            index = torch.cat([self._padded([t.response_ids for t in group])[..., None],
                               self._padded([t.teacher_topm_ids for t in group])], dim=-1)
            teacher = hidden_logprobs(head, hidden, index, self.cfg.teacher.logprob_chunk_tokens, self.temperature,
                                      chunks, recompute=not self.sharded)
            mask = self._padded([t.loss_mask for t in group]).float()  # 0 past each response
            sign = torch.tensor([outcome_sign(t.reward) for t in group], device=self.device)
            kl, margin_term, delta = composer_terms(
                teacher, self._padded([t.student_logprobs for t in group]),
                self._padded([t.student_topm_logprobs for t in group]), mask, sign, beta, margin, self.divergence)
            self.engine.backward((kl.sum() + margin_term.sum() + self._anchor_loss(group, latents)) * scale)
            signed_delta_sum += float((sign[:, None] * delta.detach() * mask).sum())
            gap_sum += float((delta.detach() * mask).sum())
            tokens += float(mask.sum())
            kl_sum += float(kl.detach().sum())
        for k in range(count, most):  # a sharded rank with fewer passes makes the others' module calls, weighing 0
            self.engine.set_gradient_accumulation_boundary(k == most - 1)
            self.engine.backward(self._idle_loss(chunks))
        grad_norm = self._step_if_finite()
        signed_delta_sum, tokens, kl_sum, gap_sum = self._sum_over_ranks([signed_delta_sum, tokens, kl_sum, gap_sum])
        return {"lopd/kl": kl_sum / total, "lopd/delta": signed_delta_sum / max(tokens, 1.0),
                "lopd/teacher_student_gap": gap_sum / max(tokens, 1),
                "lopd/phi_grad_norm": grad_norm, "lopd/skipped_phi_steps": float(self.skipped_phi_steps)}

    def _step_if_finite(self) -> float:
        """phi's AdamW step, skipped (and counted) when its gradient norm, averaged over the ranks already, is not
        finite, as the official code does. Returns the norm before clipping."""
        norm = gradient_norm(self.composer.phi_parameters())
        if math.isfinite(norm):
            self.engine.step()
        else:
            self.engine.optimizer.zero_grad(set_to_none=True)
            self.skipped_phi_steps += 1
        return norm

    def _idle_loss(self, chunks: int) -> torch.Tensor:
        """0 times an idle trajectory's pass, as the composer's step scores one: its backward gathers what a real
        pass's does."""
        pass_ = self._new_pass([self._idle_trajectory()])
        index = self._padded([t.response_ids for t in pass_.group])[..., None]
        teacher = hidden_logprobs(pass_.head, pass_.hidden, index, self.cfg.teacher.logprob_chunk_tokens,
                                  self.temperature, chunks, recompute=False)
        return teacher.sum() * 0.0

    def _anchor_loss(self, trajs: list[Trajectory], latents: list[torch.Tensor]) -> torch.Tensor:
        """The algorithm's anchor on `trajs`' latents: once per distinct encoding (the samples of a task share one),
        weighted by the samples that share it."""
        shared: dict[int, tuple[Trajectory, torch.Tensor, int]] = {}
        for t, latents_Ld in zip(trajs, latents):
            first, _, count = shared.get(id(latents_Ld), (t, latents_Ld, 0))
            shared[id(latents_Ld)] = (first, latents_Ld, count + 1)
        return self.algorithm.anchor_loss(
            [(latents_Ld, torch.stack([self.anchor_latents[text] for text in t.retrieved_texts]).reshape(
                latents_Ld.shape), count) for t, latents_Ld, count in shared.values()], self.device)

    def _broadcast_phi(self) -> None:
        import torch.distributed as dist

        if self.world_size > 1:
            for param in self.composer.phi_parameters():
                dist.broadcast(param.data, src=0)

    def cold_start(self, examples: list[dict], steps: int) -> dict[str, float]:
        """METHOD 2.4: minimize the NLL of successful answers' tokens under the frozen teacher conditioned on the
        latents of their retrieved experience, batches drawn in a `train.seed` order. `examples`: {"task_index",
        "answer", "retrieved_texts"}. With composer.cold_start_entry_steps, free latents per entry are fitted by the
        same NLL first and the composer regressed onto them. The result becomes phi_0, the anchor of the
        margin-constrained phase."""
        cc = self.comp_cfg
        named = dict(self.composer.named_phi_parameters())
        groups = {"lora": [p for n, p in named.items() if "lora" in n],
                  "compressor": [p for n, p in named.items() if "lora" not in n]}
        clips = {"lora": cc.cold_start_lora_grad_clip, "compressor": cc.cold_start_compressor_grad_clip}

        def clip() -> None:  # per group, by hand: the engine clips no global norm
            for name, params in groups.items():
                torch.nn.utils.clip_grad_norm_(params, clips[name])

        trajs = self._cold_start_trajectories(examples)
        order = torch.Generator().manual_seed(self.cfg.train.seed)

        def draw(items: list) -> list:
            return [items[i] for i in torch.randperm(len(items), generator=order)[:cc.cold_start_batch_size]]

        stats = {}
        if cc.cold_start_entry_steps:
            targets, entry_losses = self._fit_entry_latents(trajs, lambda: draw(trajs))
            texts = sorted(targets)
            engine = adamw_engine(self.composer, list(named.values()), cc.cold_start_regression_lr,
                                  deepspeed_config(0.0))
            regression = self._regress_composer(engine, targets, lambda: draw(texts), clip)
            stats = {"cold_start/entry_nll_first": entry_losses[0], "cold_start/entry_nll_last": entry_losses[-1],
                     "cold_start/regression_first": regression[0], "cold_start/regression_last": regression[-1]}
        # each phase its own AdamW (and the margin phase fresh moments after them)
        engine = adamw_engine(self.composer, list(named.values()), cc.cold_start_lr, deepspeed_config(0.0))
        losses = self._nll_steps(engine, steps, lambda: draw(trajs), self._composer_latents, clip)
        self.composer.zero_grad(set_to_none=True)
        self._broadcast_phi()
        self.phi0 = self._phi_copy()
        self.anchor_latents.clear()
        self.scoring_passes = []
        return {**stats, "cold_start/nll_first": losses[0], "cold_start/nll_last": losses[-1]} if losses else stats

    def _cold_start_trajectories(self, examples: list[dict]) -> list[Trajectory]:
        eos, trajs = self.tokenizer.eos_token_id, []
        for ex in examples:
            response = self.tokenizer(ex["answer"], add_special_tokens=False)["input_ids"] + [eos]
            t = Trajectory("cold_start", -1, [], response, [1] * len(response), [], [], -1,
                           task_index=ex["task_index"], retrieved_texts=ex["retrieved_texts"],
                           teacher_context=latent_context(self.comp_cfg))
            t.retrieved_ids = [f"cold_start/{j}" for j in range(len(ex["retrieved_texts"]))]
            trajs.append(t)
        return trajs

    def _composer_latents(self, group: list[Trajectory]) -> list[torch.Tensor]:
        return self.composer.latents([self._entry_ids(t) for t in group])

    def _nll_steps(self, engine, steps: int, draw, latents_of, clip) -> list[float]:
        """`steps` AdamW steps of `engine` on the answers' NLL (each answer's mean, averaged over the batch) given
        `latents_of(group)`; every rank takes the same batches (the all-reduce averages equal gradients; sharded
        ranks pass in lockstep). Returns each step's loss."""
        losses = []
        for _ in range(steps):
            batch = draw()
            total, micro_batches = 0.0, self._micro_batches(batch)
            for k, group in enumerate(micro_batches):
                engine.set_gradient_accumulation_boundary(k == len(micro_batches) - 1)
                hidden, head = self._padded_hidden(group, latents_of(group))
                index = self._padded([t.response_ids for t in group])[..., None]
                mask = self._padded([t.loss_mask for t in group]).float()
                logp = hidden_logprobs(head, hidden, index, self.cfg.teacher.logprob_chunk_tokens,
                                       recompute=not self.sharded)[..., 0]
                nll = answer_nll(logp, mask)
                engine.backward(nll / len(batch))
                total += float(nll.detach()) / len(batch)
            clip()
            engine.step()
            losses.append(total)
        return losses

    def _fit_entry_latents(self, trajs: list[Trajectory], draw) -> tuple[dict[str, torch.Tensor], list[float]]:
        """Free latents [K, d] per distinct retrieved entry text, all starting from one draw at the token
        embeddings' scale (entries of one kind then get alike gradients and stay alike), fitted by the cold
        start's NLL. Returns {entry text: its latents} and each step's loss."""
        cc, d = self.comp_cfg, self.composer.hidden_size
        texts = sorted({text for t in trajs for text in t.retrieved_texts})
        row = {text: i for i, text in enumerate(texts)}
        start = torch.randn(cc.num_queries, d, generator=torch.Generator().manual_seed(self.cfg.train.seed))
        table = EntryLatents(start * token_embedding_rms(self.backbone), len(texts)).to(self.device)
        engine = adamw_engine(table, [table.latents], cc.cold_start_regression_lr, deepspeed_config(0.0))

        def latents_of(group: list[Trajectory]) -> list[torch.Tensor]:
            return [table.latents[[row[text] for text in t.retrieved_texts]].reshape(-1, d) for t in group]

        losses = self._nll_steps(engine, cc.cold_start_entry_steps, draw, latents_of, lambda: None)
        return {text: table.latents[i].detach() for text, i in row.items()}, losses

    def _regress_composer(self, engine, targets: dict[str, torch.Tensor], draw, clip) -> list[float]:
        """composer.cold_start_regression_steps AdamW steps of the composer toward `targets`: the mean squared
        error of its latents relative to the targets' mean square. Returns each step's loss."""
        losses = []
        for _ in range(self.comp_cfg.cold_start_regression_steps):
            texts = draw()
            engine.set_gradient_accumulation_boundary(True)
            latents = self.composer.encode([self._tokens(text) for text in texts])
            target = torch.stack([targets[text] for text in texts]).to(latents.dtype)
            loss = regression_loss(latents, target)
            engine.backward(loss)
            clip()
            engine.step()
            losses.append(float(loss.detach()))
        return losses

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """Every rank calls it; DeepSpeed writes phi and its optimizer, rank 0 the rest."""
        self.engine.save_checkpoint(directory, tag="composer", exclude_frozen_parameters=True)
        super().save_checkpoint(directory)
        if self.rank == 0:
            torch.save({"phi0": self.phi0, "anchor_latents": self.anchor_latents,
                        "skipped_phi_steps": self.skipped_phi_steps},
                       os.path.join(directory, "composer_state.pt"))

    def load_checkpoint(self, directory: str) -> None:
        # The frozen backbone is not in the checkpoint (exclude_frozen_parameters), hence not strict.
        path, _ = self.engine.load_checkpoint(directory, tag="composer", load_module_strict=False)
        if path is None:
            raise FileNotFoundError(f"no composer checkpoint under {directory}")
        super().load_checkpoint(directory)
        state = torch.load(os.path.join(directory, "composer_state.pt"), weights_only=False)
        self.phi0, self.anchor_latents = state["phi0"], state["anchor_latents"]  # beta: the algorithm's state
        self.skipped_phi_steps = state.get("skipped_phi_steps", 0)
        self.scoring_passes = []  # of another phi

    def save_phi(self, path: str) -> None:
        buffer = io.BytesIO()
        torch.save(self.composer.phi_state_dict(), buffer)
        write_file(path, buffer.getvalue())

