"""TeacherWorker: the frozen self-teacher with the composer phi, scoring the student's trajectories with latent
experience inserted into its prompt, and taking the composer's margin-constrained step (METHOD 2.3-2.5)."""
from __future__ import annotations

import io
import os
from typing import Optional

import numpy as np
import torch

from lopd_ray.algorithms import make_algorithm
from lopd_ray.algorithms.lopd import dual_ascent, outcome_sign
from lopd_ray.data.batching import consecutive_groups
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.envs import make_env
from lopd_ray.learner.logprobs import hidden_logprobs, hidden_topk
from lopd_ray.learner.train_engine import deepspeed_config, init_process_group
from lopd_ray.learner.weights_io import deserialize, verify
from lopd_ray.teacher.weights import follow_rate
from lopd_ray.utils.atomic import write_file
from lopd_ray.utils.distributed import free_port, set_rank_env
from lopd_ray.utils.runtime import single_thread_torch


class TeacherWorker:
    """One rank of the teacher group. Ranks score disjoint shards of a batch and train the composer data-parallel
    (DeepSpeed averages phi's gradients; the dual-ascent statistics are summed over ranks, so beta is the same on
    every rank)."""

    def __init__(self, cfg, model_path: str, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: Optional[int] = None):
        single_thread_torch()
        set_rank_env(rank, world_size, master_addr, master_port or free_port())
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lopd_ray.teacher.composer import Composer

        self.cfg, self.comp_cfg, self.algo_cfg = cfg, cfg.composer, cfg.algorithm.lopd
        self.divergence = make_algorithm(cfg.algorithm).divergence
        self.temperature = cfg.algorithm.distill_temperature
        self.rank, self.world_size = rank, world_size
        self.follow_rate, self.followed_version = follow_rate(cfg.teacher), -1
        self.device = init_process_group(cfg.teacher.gpus_per_worker > 0, cfg.learner.comm_timeout_s)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        backbone = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)
        torch.manual_seed(cfg.train.seed)  # phi's initialization is part of the run's configuration
        self.composer = Composer(backbone, self.comp_cfg).to(self.device)
        if self.comp_cfg.init_path:
            self.composer.load_phi_state_dict(torch.load(self.comp_cfg.init_path, weights_only=True))
        self._broadcast_phi()  # every rank of the group starts from rank 0's phi
        optimizer = torch.optim.AdamW(self.composer.phi_parameters(), lr=self.comp_cfg.lr)
        self.engine, *_ = deepspeed.initialize(model=self.composer, optimizer=optimizer,
                                               config=deepspeed_config(self.comp_cfg.grad_clip))
        _, self.tasks = make_env(cfg.env)
        self.beta = self.algo_cfg.beta_init
        self.phi0 = self._phi_copy()
        self.anchor_latents: dict[str, torch.Tensor] = {}
        self.placeholder_id = self.tokenizer.pad_token_id or 0
        self.prompts: dict[tuple[int, int], tuple[list[int], slice]] = {}

    # ---- the teacher's view of a trajectory ------------------------------------------------------------------
    def _phi_copy(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.composer.phi_state_dict().items()}

    def _entry_ids(self, t: Trajectory) -> list[list[int]]:
        return [self.tokenizer(text, add_special_tokens=False)["input_ids"][:self.comp_cfg.max_entry_tokens]
                for text in t.retrieved_texts]

    def _prompt(self, t: Trajectory, num_latents: int) -> tuple[list[int], slice]:
        """The teacher's prompt ids for `t`, with `num_latents` placeholders, and their slice (rendered once per
        task and latent count: micro-batching and the forward both need it, every step)."""
        from lopd_ray.teacher.injection import teacher_prompt_ids

        key = (t.task_index, num_latents)
        if key not in self.prompts:
            self.prompts[key] = teacher_prompt_ids(self.tokenizer, self.tasks[key[0]].messages, num_latents,
                                                   self.comp_cfg.framing_before, self.comp_cfg.framing_after,
                                                   self.placeholder_id)
        return self.prompts[key]

    def _hidden_rows(self, trajs: list[Trajectory], latents: list[torch.Tensor]):
        """One right-padded teacher forward over `trajs`: per trajectory, the hidden states at the positions that
        score its response tokens ([R_i, d]), and the output head."""
        from lopd_ray.teacher.injection import embed_with_latents, response_positions, teacher_sequence

        prompts = [self._prompt(t, latents_Ld.shape[0]) for t, latents_Ld in zip(trajs, latents, strict=True)]
        seqs = [teacher_sequence(prompt, t.response_ids) for (prompt, _), t in zip(prompts, trajs)]
        ids = torch.full((len(seqs), max(map(len, seqs))), self.placeholder_id, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(seqs):
            ids[row, :len(seq)] = torch.tensor(seq, device=self.device)
            mask[row, :len(seq)] = 1
        with self.composer.teacher_model() as model:
            embeds = embed_with_latents(model, ids, [span for _, span in prompts], latents)
            hidden = model.get_decoder()(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
            head = model.get_output_embeddings()
        rows = [hidden[row, response_positions(len(prompt), len(t.response_ids))]
                for row, ((prompt, _), t) in enumerate(zip(prompts, trajs))]
        return rows, head

    def _hidden(self, t: Trajectory, latents_Ld: torch.Tensor):
        """Teacher hidden states at the positions that score each response token of one trajectory: [1, R, d]."""
        rows, head = self._hidden_rows([t], [latents_Ld])
        return rows[0][None], head

    def _latents(self, trajs: list[Trajectory]) -> list[torch.Tensor]:
        """c_phi per trajectory, [J*K, d]; trajectories that retrieved the same entries (a task's samples) share
        one encoding, and so its gradient."""
        keys = [tuple(t.retrieved_ids) for t in trajs]
        first: dict[tuple, Trajectory] = {}
        for key, t in zip(keys, trajs):
            first.setdefault(key, t)
        encoded = dict(zip(first, self.composer.latents([self._entry_ids(t) for t in first.values()])))
        return [encoded[key] for key in keys]

    def _micro_batches(self, trajs: list[Trajectory]) -> list[list[Trajectory]]:
        """Consecutive groups whose padded teacher length stays within learner.max_tokens_per_micro_batch."""
        lengths = [len(self._prompt(t, len(t.retrieved_texts) * self.comp_cfg.num_queries)[0]) + len(t.response_ids)
                   for t in trajs]
        return [[trajs[i] for i in group]
                for group in consecutive_groups(lengths, self.cfg.learner.max_tokens_per_micro_batch)]

    def _anchors(self, trajs: list[Trajectory]) -> None:
        """Caches c_phi0, the latents of the cold-start composer, for entries not seen before."""
        new = [t for t in trajs if any(e not in self.anchor_latents for e in t.retrieved_ids)]
        if not new:
            return
        current = self._phi_copy()
        self.composer.load_phi_state_dict(self.phi0)
        K = self.comp_cfg.num_queries
        with torch.no_grad():
            for t in new:
                if all(e in self.anchor_latents for e in t.retrieved_ids):  # another sample of the task had them
                    continue
                latents = self.composer.latents([self._entry_ids(t)])[0]
                for j, entry in enumerate(t.retrieved_ids):
                    self.anchor_latents[entry] = latents[j * K:(j + 1) * K].clone()
        self.composer.load_phi_state_dict(current)

    # ---- stages ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, trajs: list[Trajectory]) -> list[Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """Per trajectory, at `algorithm.distill_temperature`: the teacher's top-M token ids [R, M] and log-probs
        [R, M] at every response token, and its log-prob of each sampled token [R]. Trajectories without retrieved
        experience get None."""
        scored = [t for t in trajs if t.retrieved_ids]
        self._anchors(scored)
        chunk, results = self.cfg.learner.logprob_chunk_tokens, {}
        for group in self._micro_batches(scored):
            rows, head = self._hidden_rows(group, self._latents(group))
            for t, hidden in zip(group, rows):
                ids, logp = hidden_topk(head, hidden[None], self.cfg.teacher.top_m, chunk, self.temperature)
                sampled = hidden_logprobs(head, hidden[None], self._tensor(t.response_ids)[None, :, None], chunk,
                                          self.temperature)[0, :, 0]
                results[id(t)] = tuple(x.cpu().numpy() for x in (ids[0], logp[0], sampled))
        return [results.get(id(t)) for t in trajs]

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def update_composer(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One AdamW step on phi: KL to the pre-update student + beta * margin violation + anchor, then dual ascent.
        Each trajectory carries the pre-update student log-probs (`student_logprobs`, `student_topm_logprobs`). Every
        rank is called, with its shard (maybe empty); losses are means over the trajectories of all ranks."""
        trajs = [t for t in trajs if t.retrieved_ids and t.student_logprobs is not None]
        self._anchors(trajs)
        total = int(self._sum_over_ranks([len(trajs)])[0])
        if total == 0:
            return {"lopd/beta": self.beta}
        scale = self.world_size / total  # DeepSpeed averages gradients over ranks
        a, m = self.algo_cfg, self.algo_cfg.margin
        self.engine.train()
        signed_delta_sum, tokens, kl_sum, gap_sum = 0.0, 0.0, 0.0, 0.0
        if not trajs:  # this rank still joins the gradient all-reduce
            self.engine.set_gradient_accumulation_boundary(True)
            self.engine.backward(sum(p.sum() for p in self.composer.phi_parameters()) * 0.0)
        groups = self._micro_batches(trajs)
        for k, group in enumerate(groups):
            self.engine.set_gradient_accumulation_boundary(k == len(groups) - 1)
            latents = self._latents(group)
            rows, head = self._hidden_rows(group, latents)
            group_loss = 0.0
            for t, hidden, latents_Ld in zip(group, rows, latents):
                student_sampled, student_topm = self._tensor(t.student_logprobs), self._tensor(t.student_topm_logprobs)
                index = torch.cat([self._tensor(t.response_ids)[:, None], self._tensor(t.teacher_topm_ids)], dim=-1)
                teacher = hidden_logprobs(head, hidden[None], index[None], self.cfg.learner.logprob_chunk_tokens,
                                          self.temperature)[0]
                mask = self._tensor(t.loss_mask).float()
                n = mask.sum().clamp(min=1.0)
                delta = teacher[:, 0] - student_sampled
                kl = (self.divergence(student_topm[None], teacher[None, :, 1:])[0] * mask).sum() / n
                sign = outcome_sign(t.reward)
                margin_term = self.beta * (m - sign * (delta * mask).sum() / n)
                anchor = torch.stack([self.anchor_latents[e] for e in t.retrieved_ids]).reshape(latents_Ld.shape)
                anchor_term = a.anchor_coef * ((latents_Ld - anchor) ** 2).mean()
                group_loss = group_loss + kl + margin_term + anchor_term
                signed_delta_sum += float((sign * delta.detach() * mask).sum())
                gap_sum += float((delta.detach() * mask).sum())
                tokens += float(mask.sum())
                kl_sum += float(kl.detach())
            self.engine.backward(group_loss * scale)
        self.engine.step()
        signed_delta_sum, tokens, kl_sum, gap_sum = self._sum_over_ranks([signed_delta_sum, tokens, kl_sum, gap_sum])
        measured = signed_delta_sum / max(tokens, 1.0)
        beta_used = self.beta
        self.beta = dual_ascent(self.beta, measured, m, a.dual_lr)
        return {"lopd/kl": kl_sum / total, "lopd/delta": measured, "lopd/beta": beta_used,
                "lopd/margin_violation": max(0.0, m - measured), "lopd/teacher_student_gap": gap_sum / max(tokens, 1)}

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        summed = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(summed)
        return summed.tolist()

    def _broadcast_phi(self) -> None:
        import torch.distributed as dist

        if self.world_size > 1:
            for param in self.composer.phi_parameters():
                dist.broadcast(param.data, src=0)

    # ---- teacher weights that follow the student (teacher.weights=live|ema) -----------------------------------
    def _backbone_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The backbone's own weights under their HF names (peft's `.base_layer` wrapper removed, LoRA left out)."""
        base = self.composer.lm.get_base_model()
        return {n.replace(".base_layer", ""): p for n, p in base.named_parameters() if "lora_" not in n}

    @torch.no_grad()
    def follow_student(self, version: int, export: dict) -> dict:
        """theta_T <- theta_T + rate * (theta_S - theta_T) with the student's weights of `version` (once per
        version, so a resumed run does not apply the sync it restarts with twice)."""
        bad = verify(export["payload"], export["checksums"])
        if bad:
            return {"version": self.followed_version, "corrupt": bad}
        if version > self.followed_version:
            student = deserialize(export["payload"])
            for name, param in self._backbone_parameters().items():
                param.lerp_(student[name].to(param.device, param.dtype), self.follow_rate)
            self.followed_version = version
        return {"version": version, "corrupt": []}

    def cold_start(self, examples: list[dict], steps: int) -> dict[str, float]:
        """METHOD 2.4: minimize the NLL of successful answers' tokens under the frozen teacher conditioned on the
        latents of their retrieved experience, batches drawn in a `train.seed` order. `examples`: {"task_index",
        "answer", "retrieved_texts"}. The result becomes phi_0, the anchor of the margin-constrained phase."""
        cc = self.comp_cfg
        named = dict(self.composer.named_phi_parameters())
        groups = {"lora": [p for n, p in named.items() if "lora" in n],
                  "compressor": [p for n, p in named.items() if "lora" not in n]}
        clips = {"lora": cc.cold_start_lora_grad_clip, "compressor": cc.cold_start_compressor_grad_clip}
        optimizer = torch.optim.AdamW(self.composer.phi_parameters(), lr=cc.cold_start_lr)
        eos = self.tokenizer.eos_token_id
        trajs = []
        for ex in examples:
            response = self.tokenizer(ex["answer"], add_special_tokens=False)["input_ids"] + [eos]
            trajs.append(Trajectory("cold_start", -1, [], response, [1] * len(response), [], [], -1,
                                    task_index=ex["task_index"], retrieved_texts=ex["retrieved_texts"]))
        order = torch.Generator().manual_seed(self.cfg.train.seed)
        losses = []
        for _ in range(steps if self.rank == 0 else 0):  # rank 0 trains, then broadcasts phi_0
            batch = [trajs[i] for i in torch.randperm(len(trajs), generator=order)[:cc.cold_start_batch_size]]
            optimizer.zero_grad()
            total = 0.0
            for t in batch:
                hidden, head = self._hidden(t, self.composer.latents([self._entry_ids(t)])[0])
                index = self._tensor(t.response_ids)[None, :, None]
                nll = -hidden_logprobs(head, hidden, index, self.cfg.learner.logprob_chunk_tokens).mean()
                (nll / len(batch)).backward()
                total += float(nll.detach()) / len(batch)
            for name, params in groups.items():
                torch.nn.utils.clip_grad_norm_(params, clips[name])
            optimizer.step()
            losses.append(total)
        self.composer.zero_grad(set_to_none=True)
        self._broadcast_phi()
        self.phi0 = self._phi_copy()
        self.anchor_latents.clear()
        return {"cold_start/nll_first": losses[0], "cold_start/nll_last": losses[-1]} if losses else {}

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """Every rank calls it; DeepSpeed writes phi and its optimizer, rank 0 the rest (the backbone only when it
        follows the student)."""
        self.engine.save_checkpoint(directory, tag="composer", exclude_frozen_parameters=True)
        if self.rank != 0:
            return
        backbone = ({n: p.detach().cpu().clone() for n, p in self._backbone_parameters().items()}
                    if self.follow_rate is not None else None)
        torch.save({"beta": self.beta, "phi0": self.phi0, "anchor_latents": self.anchor_latents,
                    "followed_version": self.followed_version, "backbone": backbone},
                   os.path.join(directory, "composer_state.pt"))

    def load_checkpoint(self, directory: str) -> None:
        # The frozen backbone is not in the checkpoint (exclude_frozen_parameters), hence not strict.
        path, _ = self.engine.load_checkpoint(directory, tag="composer", load_module_strict=False)
        if path is None:
            raise FileNotFoundError(f"no composer checkpoint under {directory}")
        state = torch.load(os.path.join(directory, "composer_state.pt"), weights_only=False)
        self.beta, self.phi0, self.anchor_latents = state["beta"], state["phi0"], state["anchor_latents"]
        self.followed_version = state["followed_version"]
        if state["backbone"] is not None:
            with torch.no_grad():
                for name, param in self._backbone_parameters().items():
                    param.copy_(state["backbone"][name])

    def save_phi(self, path: str) -> None:
        buffer = io.BytesIO()
        torch.save(self.composer.phi_state_dict(), buffer)
        write_file(path, buffer.getvalue())

    def get_beta(self) -> float:
        return self.beta

    def set_beta(self, beta: float) -> None:
        self.beta = beta
