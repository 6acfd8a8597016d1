"""TeacherWorker: the teacher (the student's own model, or `teacher.model_path`), scoring every token of the
student's trajectories with each trajectory's privileged context (`Trajectory.teacher_context`) in its prompt. Its
backbone is frozen, or follows the student (`teacher.weights`). LatentTeacherWorker (teacher/latent_worker.py) adds
LOPD's composer."""
from __future__ import annotations

import dataclasses
import os
from contextlib import nullcontext
from typing import Callable, Optional

import numpy as np
import ray
import torch

from lopd_ray.algorithms import make_algorithm
from lopd_ray.algorithms.distill import teacher_step_loss
from lopd_ray.algorithms.distill_diagnostics import topm_entropy
from lopd_ray.data.batching import consecutive_groups
from lopd_ray.data.by_reference import fetch_arrays
from lopd_ray.data.signals import Rows, ship
from lopd_ray.data.trajectory import TeacherContext, Trajectory
from lopd_ray.envs import make_env
from lopd_ray.modeling.logprobs import hidden_logprobs, hidden_topk
from lopd_ray.modeling.shared_prefix import decode, layout, shared_micro_batches
from lopd_ray.modeling.train_engine import (adamw_engine, deepspeed_config, init_process_group, load_partitioned,
                                           optimizer_step)
from lopd_ray.modeling.weight_channel import Channel, join, receive
from lopd_ray.modeling.weights_io import deserialize, verify
from lopd_ray.models import resolve_model_path
from lopd_ray.teacher.greedy import greedy_episode
from lopd_ray.teacher.injection import embed_with_latents, response_positions, teacher_prompt_ids, teacher_sequence
from lopd_ray.teacher.weights import follow_rate, weight_steps
from lopd_ray.utils.distributed import free_port, set_rank_env
from lopd_ray.utils.runtime import single_thread_torch

MAX_CACHED_PROMPTS = 8192


class TeacherWorker:
    """One rank of the teacher group; ranks score disjoint shards of a batch."""

    def __init__(self, cfg, model_path: str, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: Optional[int] = None):
        single_thread_torch()
        set_rank_env(rank, world_size, master_addr, master_port or free_port())
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.temperature = cfg, cfg.algorithm.distill_temperature
        self.algorithm = make_algorithm(cfg.algorithm)
        # The divergence of the teacher-side steps (LOPD's composer, the dual teacher's own step).
        self.divergence = self.algorithm.divergence
        self.rank, self.world_size = rank, world_size
        self.follow_rate, self.followed_version = follow_rate(cfg.teacher), -1
        self.device = init_process_group(cfg.teacher.gpus_per_worker > 0, cfg.teacher.comm_timeout_s)
        # The student's tokenizer and chat template render the teacher's prompt, whatever model scores it.
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        teacher_path = resolve_model_path(cfg.teacher.model_path) if cfg.teacher.model_path else model_path
        # teacher.zero_stage=3: the backbone's weights are partitioned across the ranks, which then pass in lockstep
        self.sharded = cfg.teacher.zero_stage == 3
        # The samples of a task run their shared prompt once (modeling/shared_prefix.py); sharded ranks run the
        # plain forward, since they must make the same module calls whatever their batches share.
        self.shares_prompts = not self.sharded
        if self.sharded:
            self.backbone, self.backbone_engine = load_partitioned(teacher_path)
        else:
            self.backbone = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).to(self.device)
        self.backbone.eval().requires_grad_(False)  # no dropout in the targets, no gradient into the teacher
        self.step_engine = None  # of the steps of a weight policy's own (teacher.weights=dual, learn_successes)
        if weight_steps(cfg.teacher):
            params = list(self._backbone_parameters().values())
            for param in params:
                param.requires_grad_(True)
            self.step_engine = adamw_engine(self.backbone, params, cfg.teacher.lr,
                                            deepspeed_config(cfg.teacher.grad_clip))
        _, self.tasks = make_env(cfg.env)
        # eval.teacher: the held-out split's env and tasks, whose greedy episodes `play_held_out` plays
        self.held_out = make_env(cfg.held_out_env) if cfg.eval.teacher else None
        self.placeholder_id = self.tokenizer.pad_token_id or 0
        self.prompts: dict[tuple, tuple[list[int], slice]] = {}

    # ---- what a subclass with latents overrides ---------------------------------------------------------------
    def _teacher_model(self):
        """The model of the teacher's forward (a context manager)."""
        return nullcontext(self.backbone)

    def _num_latents(self, t: Trajectory) -> int:
        return 0

    def _latents(self, trajs: list[Trajectory]) -> list[torch.Tensor]:
        """The latent vectors placed at each trajectory's latent slot, [L, d] (none here)."""
        width = self.backbone.get_input_embeddings().embedding_dim
        return [torch.zeros(0, width, device=self.device) for _ in trajs]

    # ---- the teacher's view of a trajectory ------------------------------------------------------------------
    def _prompt(self, t: Trajectory) -> tuple[list[int], slice]:
        """The teacher's prompt ids for `t` and the slice of its latent placeholders (cached: micro-batching and
        the forward both need it, every step)."""
        context, num_latents = t.teacher_context, self._num_latents(t)
        key = (t.task_index, context.text, context.placement, num_latents)
        if key not in self.prompts:
            if len(self.prompts) >= MAX_CACHED_PROMPTS:
                self.prompts.clear()
            self.prompts[key] = teacher_prompt_ids(self.tokenizer, self.tasks[t.task_index].messages, context,
                                                   num_latents, self.placeholder_id)
        return self.prompts[key]

    def _forward(self, trajs: list[Trajectory], latents: list[torch.Tensor]):
        """One right-padded teacher forward over `trajs`: the last hidden states [B, T, d], each trajectory's
        positions that score its response tokens, and the output head."""
        prompts = [self._prompt(t) for t in trajs]
        seqs = [teacher_sequence(prompt, t.response_ids) for (prompt, _), t in zip(prompts, trajs, strict=True)]
        ids = torch.full((len(seqs), max(map(len, seqs))), self.placeholder_id, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(seqs):
            ids[row, :len(seq)] = torch.tensor(seq, device=self.device)
            mask[row, :len(seq)] = 1
        spans = [span for _, span in prompts]
        shared = layout(ids, list(map(len, seqs)), [len(prompt) for prompt, _ in prompts],
                        [self._prompt_key(t) for t in trajs],
                        min((s.start for s in spans if s.stop > s.start), default=ids.shape[1])
                        ) if self.shares_prompts else None
        with self._teacher_model() as model:
            embeds = embed_with_latents(model, ids, spans, latents)
            if shared is not None and shared.saves_work():
                hidden = decode(model.get_decoder(), embeds, shared)
            else:
                hidden = model.get_decoder()(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
            head = model.get_output_embeddings()
        positions = [response_positions(len(prompt), len(t.response_ids)) for (prompt, _), t in zip(prompts, trajs)]
        return hidden, positions, head

    def _hidden_rows(self, trajs: list[Trajectory], latents: list[torch.Tensor]):
        """Per trajectory, the hidden states at the positions that score its response tokens ([R_i, d]), and the
        output head."""
        hidden, positions, head = self._forward(trajs, latents)
        return [hidden[row, at] for row, at in enumerate(positions)], head

    def _padded_hidden(self, trajs: list[Trajectory], latents: list[torch.Tensor]):
        """The same in one tensor [B, R, d] (R the longest response; rows past a response repeat a prompt
        position: the padded loss mask weighs them 0), and the output head."""
        hidden, positions, head = self._forward(trajs, latents)
        longest = max(len(at) for at in positions)
        index = torch.stack([torch.cat([at, at.new_zeros(longest - len(at))]) for at in positions]).to(self.device)
        return hidden[torch.arange(len(trajs), device=self.device)[:, None], index], head

    def _padded(self, arrays: list[np.ndarray]) -> torch.Tensor:
        """Per-trajectory arrays ([R_i, ...]) as one zero-padded tensor [B, R, ...]."""
        return torch.nn.utils.rnn.pad_sequence([self._tensor(a) for a in arrays], batch_first=True)

    def _scoring_pass(self, group: list[Trajectory]):
        """The forward pass `score` reads a micro-batch's scores from: padded hidden states and the output head."""
        return self._padded_hidden(group, self._latents(group))

    def _prompt_key(self, t: Trajectory) -> tuple:
        """Trajectories with equal keys have the same teacher prompt: the same ids, and the same retrieved entries
        (whose latents fill its slot)."""
        return tuple(self._prompt(t)[0]), tuple(t.retrieved_ids or ())

    def _micro_batches(self, trajs: list[Trajectory]) -> list[list[Trajectory]]:
        """Consecutive groups whose padded teacher forward stays within teacher.max_tokens_per_micro_batch tokens
        (with shared prompts: each prompt once, and the responses)."""
        budget, prompts = self.cfg.teacher.max_tokens_per_micro_batch, [len(self._prompt(t)[0]) for t in trajs]
        responses = [len(t.response_ids) for t in trajs]
        if self.shares_prompts:
            groups = shared_micro_batches(prompts, responses, [self._prompt_key(t) for t in trajs], budget)
        else:
            groups = consecutive_groups([p + r for p, r in zip(prompts, responses)], budget)
        return [[trajs[i] for i in group] for group in groups]

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """A copy: arrays from the object store are read-only, which torch cannot share."""
        return torch.tensor(array, device=self.device)

    # ---- lockstep (teacher.zero_stage=3): every rank makes the same module calls, each gathering its weights ----
    def _idle_trajectory(self) -> Trajectory:
        """A one-token trajectory whose pass makes the module calls of a real one, for a rank with fewer
        micro-batches than the others."""
        support = np.zeros((1, self.cfg.teacher.top_m), dtype=np.int64) if self.algorithm.makes("support_ids") else None
        return Trajectory("idle", -1, [self.placeholder_id], [self.placeholder_id], [0], [(0, 1)], [0.0], 0,
                          task_index=0, teacher_context=TeacherContext(""), support_ids=support)

    def _most_passes(self, count: int, trajs: list[Trajectory]) -> tuple[int, Optional[int]]:
        """Sharded: the most passes any rank makes (this one makes `count` on `trajs`) and the head chunks every
        pass runs (enough for the longest response of any rank); else `count` and None."""
        if not self.sharded:
            return count, None
        longest = max((len(t.response_ids) for t in trajs), default=1)
        most, chunks = self._max_over_ranks([count, -(-longest // self.cfg.teacher.logprob_chunk_tokens)])
        return most, chunks

    def _lockstep(self, groups: list[list[Trajectory]], trajs: list[Trajectory]) -> tuple[list, Optional[int]]:
        """`groups` padded with idle micro-batches to the most any rank has, and the head chunks per pass (see
        `_most_passes`)."""
        most, chunks = self._most_passes(len(groups), trajs)
        return groups + [[self._idle_trajectory()]] * (most - len(groups)), chunks

    # ---- stages ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, trajs: list[Trajectory], with_hidden: bool = False) -> list[Optional[tuple]]:
        """Per trajectory, at `algorithm.distill_temperature`: the support's token ids [R, M] (the teacher's top-M,
        or the trajectory's `support_ids`) and the teacher's log-probs there [R, M] at every response token, and
        its log-prob of each sampled token [R]; `with_hidden`, also its last hidden states there [R, d] (for a
        full-vocabulary divergence). Trajectories without a context get None."""
        scored = [t for t in trajs if t.teacher_context is not None]
        chunk, results = self.cfg.teacher.logprob_chunk_tokens, {}
        groups, chunks = self._lockstep(self._micro_batches(scored), scored)
        for group in groups:
            hidden, head = self._scoring_pass(group)
            if group[0].support_ids is None:
                ids, logp = hidden_topk(head, hidden, self.cfg.teacher.top_m, chunk, self.temperature, chunks)
            else:  # the student's top-M, given for every trajectory with a context
                ids = self._padded([t.support_ids for t in group])
                logp = hidden_logprobs(head, hidden, ids, chunk, self.temperature, chunks)
            sampled = hidden_logprobs(head, hidden, self._padded([t.response_ids for t in group])[..., None], chunk,
                                      self.temperature, chunks)[..., 0]
            arrays = [ids.cpu().numpy(), logp.cpu().numpy(), sampled.cpu().numpy()]
            if with_hidden:
                arrays.append(hidden.float().cpu().numpy())
            for row, t in enumerate(group):
                results[id(t)] = tuple(a[row, :len(t.response_ids)] for a in arrays)
        return [results.get(id(t)) for t in trajs]

    @ray.method(num_returns=2)
    def teacher_scores(self, trajs: list[Trajectory], with_hidden: bool = False) -> tuple[Rows, Rows]:
        """`score` as signals (data/signals.py; a support from the student fetched first): the teacher's log-prob
        of each sampled token and the entropy of its top-M + tail distribution, the support and its log-probs (and
        hidden states). Trajectories without a context get none."""
        fetch_arrays(trajs)
        names = ("teacher_topm_ids", "teacher_topm_logprobs", "teacher_logprobs") + (
            ("teacher_hidden",) if with_hidden else ())
        return ship({t.uid: {**dict(zip(names, s)), "teacher_entropy": topm_entropy(s[1])}
                     for t, s in zip(trajs, self.score(trajs, with_hidden)) if s is not None})

    @ray.method(num_returns=2)
    def teacher_scores_at_levels(self, trajs: list[Trajectory]) -> tuple[Rows, Rows]:
        """A graded provider's weaker contexts (`context_levels` but the last, which `teacher_scores` took): per
        trajectory, the sampled tokens' log-probs, the top-M entropies, the supports and their log-probs under
        each ([L - 1, ...] each)."""
        fetch_arrays(trajs)
        levels = len(trajs[0].context_levels) if trajs else 0
        if self.sharded:  # a rank with no graded trajectory still passes with the others
            levels = self._max_over_ranks([levels])[0]
        per_level = [self.score([dataclasses.replace(t, teacher_context=t.context_levels[k]) for t in trajs])
                     for k in range(levels - 1)]
        rows = {}
        for i, t in enumerate(trajs):
            ids, topm, sampled = (np.stack([scores[i][j] for scores in per_level]) for j in range(3))
            rows[t.uid] = {"level_topm_ids": ids, "level_topm_logprobs": topm, "level_logprobs": sampled,
                           "level_entropy": np.stack([topm_entropy(logp) for logp in topm])}
        return ship(rows)

    @torch.no_grad()
    def play_held_out(self, probes: list[Trajectory]) -> list[float]:
        """eval.teacher: the reward of the teacher's greedy episode of each probe's held-out task (`task_index` into
        eval.split) under the probe's context, its prompt built as for scoring (latents from the probe's retrieved
        entries where the teacher composes them), rollout.max_new_tokens per turn."""
        new_env, tasks = self.held_out
        rewards = []
        for t in probes:
            latents = self._latents([t])[0]
            with self._teacher_model() as model:
                episode = greedy_episode(model, self.tokenizer, tasks[t.task_index], new_env, t.teacher_context,
                                         latents, self.cfg.rollout.max_new_tokens, self.placeholder_id)
            rewards.append(episode.reward)
        return rewards

    def teacher_prompts(self, trajs: list[Trajectory]) -> list[list[int]]:
        """The token ids of each trajectory's teacher prompt (text contexts: the student can read them too)."""
        return [self._prompt(t)[0] for t in trajs]

    @ray.method(num_returns=2)
    def teacher_scores_without_context(self, trajs: list[Trajectory]) -> tuple[Rows, Rows]:
        """The teacher's log-prob of each sampled token with an empty context, for trajectories that have a (text)
        context: the baseline that separates what the context adds from what the teacher knows anyway."""
        fetch_arrays(trajs)
        bare = [dataclasses.replace(t, teacher_context=TeacherContext("", t.teacher_context.placement))
                if t.teacher_context is not None else t for t in trajs]
        return ship({t.uid: {"teacher_plain_logprobs": score[2]}
                     for t, score in zip(trajs, self.score(bare)) if score is not None})

    def step_toward_student(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One step of the teacher's backbone (teacher.weights=dual): minimize the distillation divergence
        between the UPDATED student (`student_topm_logprobs`, fixed) and the teacher with its context, on the
        teacher's top-M of the same trajectories. Every rank is called, with its shard (maybe empty); gradients and
        the reported divergence are averaged over all ranks' action tokens."""
        fetch_arrays(trajs)
        trajs = [t for t in trajs if t.student_topm_logprobs is not None]
        total_tokens = self._sum_over_ranks([float(sum(t.num_action_tokens for t in trajs))])[0]

        def divergence(group, hidden, head):
            teacher = hidden_logprobs(head, hidden, self._padded([t.teacher_topm_ids for t in group]),
                                      self.cfg.teacher.logprob_chunk_tokens, self.temperature)
            return teacher_step_loss(self._padded([t.student_topm_logprobs for t in group]), teacher,
                                     self._padded([t.loss_mask for t in group]), total_tokens, self.divergence)
        value, grad_norm = self._backbone_step(trajs, divergence)
        return {"teacher/step_divergence": value, "teacher/step_grad_norm": grad_norm}

    def learn_successes(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One step of the teacher's backbone (teacher.weights=learn_successes): the NLL of the batch's successful
        responses (reward >= algorithm.distill.success_threshold), each under its teacher prompt, token mean over
        every rank's successes. Every rank is called, with its shard (maybe empty)."""
        fetch_arrays(trajs)
        trajs = [t for t in trajs if t.reward >= self.cfg.algorithm.distill.success_threshold]
        total_tokens = self._sum_over_ranks([float(sum(t.num_action_tokens for t in trajs))])[0]
        if total_tokens == 0:  # no success on any rank: no step (weight decay alone would move the backbone)
            return {"teacher/success_nll": 0.0, "teacher/success_tokens": 0.0, "teacher/step_grad_norm": 0.0}

        def nll(group, hidden, head):
            logp = hidden_logprobs(head, hidden, self._padded([t.response_ids for t in group])[..., None],
                                   self.cfg.teacher.logprob_chunk_tokens, self.temperature)[..., 0]
            return -(logp * self._padded([t.loss_mask for t in group])).sum() / total_tokens
        value, grad_norm = self._backbone_step(trajs, nll)
        return {"teacher/success_nll": value, "teacher/success_tokens": total_tokens,
                "teacher/step_grad_norm": grad_norm}

    def _backbone_step(self, trajs: list[Trajectory], loss_of) -> tuple[float, float]:
        """One AdamW step of the backbone (a weight policy's own step) on `loss_of(group, hidden, head)`, a
        micro-batch's loss over every rank's tokens; DeepSpeed averages the ranks' gradients, so each rank's loss
        is scaled to their sum. A rank with nothing still joins the gradient all-reduce. Returns the loss summed
        over the ranks and the gradient norm."""
        engine, value = self.step_engine, 0.0
        groups = self._micro_batches(trajs)
        if not groups:
            engine.set_gradient_accumulation_boundary(True)
            engine.backward(sum(p.sum() for p in self._backbone_parameters().values()) * 0.0)
        for k, group in enumerate(groups):
            engine.set_gradient_accumulation_boundary(k == len(groups) - 1)
            loss = loss_of(group, *self._padded_hidden(group, self._latents(group)))
            engine.backward(loss * self.world_size)
            value += float(loss.detach())
        grad_norm = optimizer_step(engine)
        return self._sum_over_ranks([value])[0], grad_norm

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        return self._reduce_over_ranks(values, "SUM")

    def _max_over_ranks(self, values: list[int]) -> list[int]:
        return [int(v) for v in self._reduce_over_ranks(values, "MAX")]

    def _reduce_over_ranks(self, values: list[float], op: str) -> list[float]:
        import torch.distributed as dist

        reduced = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(reduced, op=getattr(dist.ReduceOp, op))
        return reduced.tolist()

    # ---- teacher weights that follow the student (teacher.weights=live|ema) -----------------------------------
    def _backbone_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The backbone's own weights under their HF names (an adapter's `.base_layer` wrapper removed, LoRA left
        out)."""
        return {n.replace(".base_layer", ""): p for n, p in self.backbone.named_parameters() if "lora_" not in n}

    @torch.no_grad()
    def follow_student(self, version: int, export: dict) -> dict:
        """theta_T <- theta_T + rate * (theta_S - theta_T) with the student's weights of `version`, at every
        `teacher.follow_every`-th version, once per version (a resumed run does not apply the sync it restarts with
        twice)."""
        bad = verify(export["payload"], export["checksums"])
        if bad:
            return {"version": self.followed_version, "corrupt": bad}
        return self._follow(version, lambda: deserialize(export["payload"]))

    def open_weight_channel(self, channel: dict, rank: int) -> None:
        self.channel, self.channel_device = join(channel, rank), Channel(**channel).device

    def follow_broadcast(self, version: int, buckets: list) -> dict:
        """`follow_student` with the weights rank 0 broadcasts now on the open channel (sync.method=collective)."""
        received = dict(receive(self.channel, buckets, self.channel_device))  # every broadcast is read to the end
        return self._follow(version, lambda: received)

    def _follow(self, version: int, student_weights: Callable[[], dict[str, torch.Tensor]]) -> dict:
        follows = self.follow_rate is not None and version % self.cfg.teacher.follow_every == 0
        if follows and version > self.followed_version:
            student = student_weights()
            for name, param in self._backbone_parameters().items():
                param.lerp_(student[name].to(param.device, param.dtype), self.follow_rate)
            self.followed_version = version
        return {"version": version, "corrupt": []}

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """Rank 0 writes the backbone when it moves (a frozen one is the model itself), and its optimizer."""
        if self.rank != 0:
            return
        moves = self.follow_rate is not None or self.step_engine is not None
        backbone = {n: p.detach().cpu().clone() for n, p in self._backbone_parameters().items()} if moves else None
        optimizer = self.step_engine.optimizer.state_dict() if self.step_engine is not None else None
        torch.save({"followed_version": self.followed_version, "backbone": backbone, "optimizer": optimizer},
                   os.path.join(directory, "teacher_state.pt"))

    def load_checkpoint(self, directory: str) -> None:
        state = torch.load(os.path.join(directory, "teacher_state.pt"), weights_only=False)
        self.followed_version = state["followed_version"]
        if state["backbone"] is not None:
            with torch.no_grad():
                for name, param in self._backbone_parameters().items():
                    param.copy_(state["backbone"][name])
        if state["optimizer"] is not None:
            self.step_engine.optimizer.load_state_dict(state["optimizer"])
