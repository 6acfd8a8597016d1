"""PolicyLearner: one rank of the student's DeepSpeed data-parallel group (a Ray actor per rank)."""
from __future__ import annotations

import os
from collections import defaultdict
from datetime import timedelta
from typing import Optional

import ray
import torch

from lopd_ray.algorithms import make_algorithm
from lopd_ray.algorithms.losses import token_weights, truncated_is_weights
from lopd_ray.data.batching import RankPlan, UpdateNorm
from lopd_ray.data.by_reference import fetch_arrays
from lopd_ray.data.signals import Rows, ship
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.modeling.logprobs import FullVocabTeacher, TokenLogProbModel, collate, hidden_topk, response_values
from lopd_ray.modeling.student_lora import hf_parameters, merged_layers
from lopd_ray.modeling.weight_channel import Bucket, Channel, join, plan_buckets, send
from lopd_ray.modeling.weights_io import serialize
from lopd_ray.utils.distributed import set_rank_env
from lopd_ray.utils.rng import rng_state, set_rng_state
from lopd_ray.utils.runtime import single_thread_torch


class PolicyLearner:
    def __init__(self, cfg, model_path: str, rank: int, world_size: int, master_addr: str, master_port: int):
        single_thread_torch()
        set_rank_env(rank, world_size, master_addr, master_port)
        from lopd_ray.modeling.train_engine import build_train_engine, init_process_group

        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_process_group(cfg.learner.gpus_per_learner > 0, cfg.learner.comm_timeout_s)
        self.algorithm = make_algorithm(cfg.algorithm)
        self.engine, self.model, self.pad_id = build_train_engine(cfg, model_path, self.device)
        self.reference = self._load_reference(model_path) if self.algorithm.needs_reference else None
        self.teacher_head = self._load_teacher_head(model_path) if self.algorithm.makes("teacher_hidden") else None
        # The probe compares with the engine, which sampled at the rollout temperature; the training step scores at
        # the algorithm's (a distillation's student and teacher share algorithm.distill_temperature).
        self.probe_temperature = cfg.rollout.temperature
        self.train_temperature = self.algorithm.learner_temperature(cfg)
        self.tis_cap = cfg.train.tis_cap if cfg.train.mode == "async" else 0.0
        self.channel_store = self.channel = None  # sync.method=collective

    def _load_reference(self, model_path: str):
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device).eval()
        return TokenLogProbModel(ref.requires_grad_(False))

    def _load_teacher_head(self, model_path: str) -> torch.nn.Module:
        """The frozen teacher's output head (its initial checkpoint, or teacher.model_path's), for full-vocabulary
        divergences from the hidden states the teacher ships; teacher.model_path comes resolved (build_learners)."""
        from transformers import AutoModelForCausalLM

        path = self.cfg.teacher.model_path or model_path
        head = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).get_output_embeddings()
        return head.to(self.device).eval().requires_grad_(False)

    # ---- log-probs -------------------------------------------------------------------------------------------
    def _dummy(self) -> list[Trajectory]:
        """A two-token stand-in for an empty micro-batch: keeps the ranks' collectives paired, weighs nothing."""
        return [Trajectory("dummy", -1, [self.pad_id], [self.pad_id], [0], [(0, 1)], [0.0], 0)]

    def _logprobs(self, model, micro: list[Trajectory], longest: int, temperature: float,
                  with_teacher: bool = False):
        """(batch, sampled-token log-probs [B, T], log-probs at the teacher's top-M [B, T, M] or None, the per-token
        full-vocabulary divergence from the teacher [B, T] or None). `model` is the engine (the student) or the
        reference LM; both take TokenLogProbModel's arguments. `with_teacher`: the divergence, where the batch
        carries the teacher's hidden states."""
        batch = collate(micro or self._dummy(), self.pad_id, self.device)
        chunk = self.cfg.learner.logprob_chunk_tokens
        teacher = (FullVocabTeacher(self.teacher_head, batch["teacher_hidden"], self.algorithm.full_vocab_divergence)
                   if with_teacher and "teacher_hidden" in batch else None)
        out = model(batch["input_ids"], batch["attention_mask"], chunk, temperature, -(-(longest - 1) // chunk),
                    batch.get("teacher_topm_ids"), teacher)
        divergence = out[..., -1] if teacher is not None else None
        out = out[..., :-1] if teacher is not None else out
        return batch, out[..., 0], (out[..., 1:] if out.shape[-1] > 1 else None), divergence

    @torch.no_grad()
    def score(self, plan: RankPlan, at_teacher_topm: bool = False, at_train_temperature: bool = False) -> list:
        """fp32 log-probs of every response token of the plan's single update, in plan order: of the sampled
        tokens ([R] arrays) at the rollout temperature (the sync probe) or `at_train_temperature`, or,
        `at_teacher_topm`, of each token's teacher top-M at the training temperature ([R, M]). All ranks call it
        together."""
        self.engine.eval()
        temperature = self.train_temperature if at_teacher_topm or at_train_temperature else self.probe_temperature
        out = []
        for micro, longest in zip(plan.minibatches[0], plan.longest[0]):
            _, logp, topm, _ = self._logprobs(self.engine, micro, longest, temperature)
            if micro:
                out.extend(response_values(micro, topm if at_teacher_topm else logp))
        return out

    @torch.no_grad()
    def student_topk(self, plan: RankPlan, k: int) -> list:
        """The student's k most likely tokens ([R, k] ids) at every response token of the plan's single update, at
        the training temperature, in plan order: the support of a distillation on the student's top-k. All ranks
        call it together."""
        self.engine.eval()
        chunk, out = self.cfg.learner.logprob_chunk_tokens, []
        for micro, longest in zip(plan.minibatches[0], plan.longest[0]):
            batch = collate(micro or self._dummy(), self.pad_id, self.device)
            hidden = self.model.get_decoder()(input_ids=batch["input_ids"],
                                              attention_mask=batch["attention_mask"]).last_hidden_state[:, :-1]
            ids, _ = hidden_topk(self.model.get_output_embeddings(), hidden, k, chunk, self.train_temperature,
                                 -(-(longest - 1) // chunk))
            if micro:
                out.extend(response_values(micro, ids))
        return out

    # ---- what the driver calls: the wide arrays in and out by reference (lopd_ray/data/by_reference.py) --------
    def _fetch(self, plan: RankPlan) -> list[Trajectory]:
        trajs = plan.trajectories()
        fetch_arrays(trajs)
        for t in trajs:
            self.algorithm.complete_targets(t)
        return trajs

    @ray.method(num_returns=2)
    def train_step_by_reference(self, plan: RankPlan, norms: list[UpdateNorm]) -> tuple[tuple, Rows]:
        """`train_step`: (metrics, the driver-held signals it made) and the blob of the others."""
        self._fetch(plan)
        metrics, student = self.train_step(plan, norms)
        rows, blob = ship(student)
        return (metrics, rows), blob

    # ---- scorers (data/signals.py): every rank calls them together on its plan's single update ---------------
    @ray.method(num_returns=2)
    def student_scores(self, plan: RankPlan, name: str) -> tuple[Rows, Rows]:
        """The student's log-prob of each sampled token at the training temperature, as the signal `name` (with
        the prompts the plan's trajectories carry: the teacher's, for DOPD's privileged student)."""
        trajs = self._fetch(plan)
        return ship({t.uid: {name: v} for t, v in zip(trajs, self.score(plan, at_train_temperature=True))})

    @ray.method(num_returns=2)
    def student_scores_at_support(self, plan: RankPlan) -> tuple[Rows, Rows]:
        """The student's log-probs at each token's support (`score(at_teacher_topm=True)`)."""
        trajs = self._fetch(plan)
        return ship({t.uid: {"student_topm_logprobs": v}
                     for t, v in zip(trajs, self.score(plan, at_teacher_topm=True))})

    @ray.method(num_returns=2)
    def student_support(self, plan: RankPlan, k: int) -> tuple[Rows, Rows]:
        """The student's top-k token ids, the support of a distillation on the student's top-k."""
        trajs = self._fetch(plan)
        return ship({t.uid: {"support_ids": v} for t, v in zip(trajs, self.student_topk(plan, k))})

    # ---- training --------------------------------------------------------------------------------------------
    def train_step(self, plan: RankPlan, norms: list[UpdateNorm]) -> tuple[dict[str, float], dict]:
        """One rollout batch: returns metrics and, when the algorithm asks for them, the pre-update student
        log-probs of each trajectory as signals ({uid: {student_logprobs: [R], student_topm_logprobs: [R, M]}})."""
        self.engine.train()
        student_logprobs = {}
        sums: dict[str, float] = defaultdict(float)
        tokens = 0.0
        from lopd_ray.modeling.train_engine import optimizer_step

        # The PPO ratio's denominator: the log-probs of the weights that sampled the batch, taken before the first
        # update (with one update per batch they equal the new ones at its forward pass).
        olds = ([self._old_logprobs(micros, longest) for micros, longest in zip(plan.minibatches, plan.longest)]
                if self.cfg.learner.updates_per_step > 1 else [None] * len(plan.minibatches))
        for micros, longest, norm, old in zip(plan.minibatches, plan.longest, norms, olds):
            for k, micro in enumerate(micros):
                self.engine.set_gradient_accumulation_boundary(k == len(micros) - 1)
                batch, logp, topm, full_divergence = self._logprobs(self.engine, micro, longest[k],
                                                                    self.train_temperature, with_teacher=True)
                old_logp = old[k] if old is not None else logp.detach()
                ref_logp = self._reference_logprobs(micro, longest[k]) if self.reference is not None else None
                loss_BT, token_metrics = self.algorithm.token_loss(batch, logp, old_logp, ref_logp,
                                                                   student_topm_BTM=topm,
                                                                   full_divergence_BT=full_divergence)
                if self.tis_cap > 0:
                    token_metrics["actor/tis_weight"] = truncated_is_weights(old_logp, batch["rollout_logprobs"],
                                                                             self.tis_cap)
                    loss_BT = loss_BT * token_metrics["actor/tis_weight"]
                if self.algorithm.returns_student_logprobs and micro:
                    for t, sampled, at_support in zip(micro, response_values(micro, logp),
                                                      response_values(micro, topm)):
                        student_logprobs[t.uid] = {"student_logprobs": sampled, "student_topm_logprobs": at_support}
                mask = batch["loss_mask"] if micro else torch.zeros_like(batch["loss_mask"])
                weights = token_weights(mask, self.cfg.algorithm.loss_agg, norm.action_tokens, norm.trajectories,
                                        self.cfg.algorithm.seq_sum_tokens)
                # DeepSpeed averages gradients over ranks; the weights already sum to 1 over all ranks.
                loss = (loss_BT * weights).sum() * self.world_size
                self.engine.backward(loss, scale_wrt_gas=False)
                n = float(mask.sum())
                tokens += n
                sums["actor/loss"] += float((loss_BT.detach() * mask).sum())
                sums["actor/entropy_proxy"] += float((-logp.detach() * mask).sum())
                for name, value in token_metrics.items():
                    sums[name] += float((value * mask).sum())
            grad_norm = optimizer_step(self.engine)
        metrics = {k: v / max(tokens, 1.0) for k, v in sums.items()}
        metrics["actor/tokens"] = tokens
        metrics["actor/grad_norm"] = grad_norm
        return metrics, student_logprobs

    @torch.no_grad()
    def _old_logprobs(self, micros: list[list[Trajectory]], longest: list[int]) -> list[torch.Tensor]:
        return [self._logprobs(self.engine, micro, n, self.train_temperature)[1] for micro, n in zip(micros, longest)]

    @torch.no_grad()
    def _reference_logprobs(self, micro: list[Trajectory], longest: int) -> torch.Tensor:
        return self._logprobs(self.reference, micro, longest, self.train_temperature)[1]

    # ---- weights and checkpoints -----------------------------------------------------------------------------
    def _parameters(self) -> dict[str, torch.Tensor]:
        """The student's parameters under the engines' names (a LoRA adapter's own left out)."""
        named = hf_parameters(self.model)
        # Tied heads are deduplicated by named_parameters; engines need the head under its own name.
        named.setdefault("lm_head.weight", self.model.get_output_embeddings().weight)
        return named

    def _weights(self) -> dict[str, torch.Tensor]:
        """The engines' view of the student, each LoRA-adapted layer merged (inside `gathered_parameters` under
        ZeRO-3)."""
        return {**self._parameters(), **merged_layers(self.model)}

    def export_weights(self) -> Optional[dict]:
        """All ranks call it (ZeRO-3 gathers); rank 0 returns {"payload": safetensors bytes, "checksums": ...}."""
        from lopd_ray.modeling.train_engine import gathered_parameters

        with gathered_parameters(self.model, self.cfg.learner.zero_stage):
            if self.rank != 0:
                return None
            payload, checksums = serialize(self._weights())
        return {"payload": payload, "checksums": checksums}

    # sync.method=collective: rank 0 is rank 0 of a broadcast channel (lopd_ray/modeling/weight_channel.py).
    def weight_channel_address(self) -> tuple[str, int]:
        """Where the channels' store listens (started on the first call, kept for the run)."""
        import ray
        import torch.distributed as dist

        if self.channel_store is None:
            self.channel_store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False,
                                               timeout=timedelta(seconds=self.cfg.sync.timeout_s))
        return ray.util.get_node_ip_address(), self.channel_store.port

    def open_weight_channel(self, channel: dict, bucket_bytes: int) -> list[Bucket]:
        """Rank 0 joins `channel`; returns the buckets every broadcast sends (shapes only, no gather needed)."""
        self.channel = join(channel, 0)
        shapes = {name: (p.dtype, tuple(getattr(p, "ds_shape", p.shape))) for name, p in self._parameters().items()}
        self.channel_buckets = plan_buckets(shapes, bucket_bytes)
        self.channel_device = Channel(**channel).device
        return self.channel_buckets

    def broadcast_weights(self) -> None:
        """All ranks call it (ZeRO-3 gathers); rank 0 sends over the open channel."""
        from lopd_ray.modeling.train_engine import gathered_parameters

        with gathered_parameters(self.model, self.cfg.learner.zero_stage):
            if self.rank == 0:
                send(self.channel, self._weights(), self.channel_buckets, self.channel_device)

    def save_checkpoint(self, directory: str) -> None:
        """Model and optimizer states (DeepSpeed's layout under `student/`) and this rank's RNG states."""
        self.engine.save_checkpoint(directory, tag="student")
        torch.save(rng_state(), os.path.join(directory, f"rng_learner_rank{self.rank}.pt"))

    def load_checkpoint(self, directory: str) -> None:
        path, _ = self.engine.load_checkpoint(directory, tag="student")
        if path is None:
            raise FileNotFoundError(f"no student checkpoint under {directory}")
        set_rng_state(torch.load(os.path.join(directory, f"rng_learner_rank{self.rank}.pt"), weights_only=False))
