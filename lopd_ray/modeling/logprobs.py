"""Per-token log-probs from a causal LM without materializing [T, V] logits for the whole sequence.

The decoder runs once; the output head and log-softmax run chunk by chunk under activation checkpointing, so
only one [chunk, V] block of logits is alive at a time, in the forward and in the backward pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from lopd_ray.data.trajectory import Trajectory


@dataclass
class FullVocabTeacher:
    """A teacher known by its last hidden states at the scored positions and its output head: the learner rebuilds
    its full-vocabulary distribution chunk by chunk and applies `divergence` (student, teacher log-probs [.., V] ->
    [..]) there, so [T, V] never exists for a whole sequence and the teacher ships [T, d], not [T, V]."""
    head: torch.nn.Module
    hidden_BTD: torch.Tensor
    divergence: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _chunk_logprobs(head: torch.nn.Module, hidden_BTH: torch.Tensor, index_BTK: torch.Tensor, temperature: float,
                    teacher_head: Optional[torch.nn.Module] = None, teacher_hidden_BTD: Optional[torch.Tensor] = None,
                    divergence=None):
    logits = head(hidden_BTH).float() / temperature
    if teacher_head is None:
        return logits.gather(-1, index_BTK) - torch.logsumexp(logits, dim=-1, keepdim=True)
    student = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        teacher = torch.log_softmax(teacher_head(teacher_hidden_BTD.to(hidden_BTH.dtype)).float() / temperature, -1)
    return torch.cat([student.gather(-1, index_BTK), divergence(student, teacher)[..., None]], dim=-1)


def hidden_logprobs(head: torch.nn.Module, hidden_BTH: torch.Tensor, index_BTK: torch.Tensor, chunk_tokens: int,
                    temperature: float = 1.0, num_chunks: int | None = None,
                    teacher: Optional[FullVocabTeacher] = None, recompute: bool = True) -> torch.Tensor:
    """[B, T, K] log-softmax(head(hidden) / temperature) at `index`, one [chunk, V] block of logits at a time; with a
    full-vocabulary `teacher`, one more column: the per-token divergence from it.

    `num_chunks` (at least what T needs) makes the head run that many times, empty chunks included, so that
    data-parallel ranks with different lengths make the same sequence of module calls. `recompute`: with gradients
    and more than one chunk, each chunk's logits are recomputed in the backward instead of kept (one chunk's logits
    are alive from the forward to the backward either way; not for a head whose weights ZeRO-3 gathers per call:
    the recomputation does not see them gathered)."""
    chunks = max(-(-hidden_BTH.shape[1] // chunk_tokens), num_chunks or 0)
    recompute = recompute and chunks > 1 and torch.is_grad_enabled()
    out = []
    for start in range(0, chunks * chunk_tokens, chunk_tokens):
        h, idx = hidden_BTH[:, start:start + chunk_tokens], index_BTK[:, start:start + chunk_tokens]
        extra = (() if teacher is None else
                 (teacher.head, teacher.hidden_BTD[:, start:start + chunk_tokens], teacher.divergence))
        if recompute:
            out.append(checkpoint(_chunk_logprobs, head, h, idx, temperature, *extra, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(head, h, idx, temperature, *extra))
    return torch.cat(out, dim=1)


def token_logprobs_at(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, chunk_tokens: int,
                      temperature: float = 1.0, num_chunks: int | None = None,
                      extra_index_BTM: torch.Tensor | None = None,
                      teacher: Optional[FullVocabTeacher] = None) -> torch.Tensor:
    """[B, T-1, 1+M]: column 0 is log p(input_ids[:, t+1] | prefix); columns 1.. are the log-probs at
    `extra_index` (e.g. a teacher's top-M tokens) at the same positions; with a full-vocabulary `teacher` (hidden
    states in the same [B, T-1] layout), a last column with the per-token divergence from it."""
    hidden_BTH = model.get_decoder()(input_ids=input_ids_BT, attention_mask=attention_mask_BT).last_hidden_state
    index_BTK = input_ids_BT[:, 1:].unsqueeze(-1)
    if extra_index_BTM is not None:
        index_BTK = torch.cat([index_BTK, extra_index_BTM], dim=-1)
    return hidden_logprobs(model.get_output_embeddings(), hidden_BTH[:, :-1], index_BTK, chunk_tokens, temperature,
                           num_chunks, teacher)


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, chunk_tokens: int,
                   temperature: float = 1.0, num_chunks: int | None = None) -> torch.Tensor:
    """[B, T-1] log p(input_ids[:, t+1] | input_ids[:, :t+1])."""
    return token_logprobs_at(model, input_ids_BT, attention_mask_BT, chunk_tokens, temperature, num_chunks)[..., 0]


def collate(micro: list[Trajectory], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded tensors aligned with `token_logprobs`' output: column t scores token t+1, so trajectory i's
    response token r sits in column `len(prompt_ids) - 1 + r`."""
    B, length = len(micro), max(t.num_tokens for t in micro)
    ids = np.full((B, length), pad_id, dtype=np.int64)
    attn = np.zeros((B, length), dtype=np.int64)
    mask, adv, rollout_lp = (np.zeros((B, length - 1), dtype=np.float32) for _ in range(3))
    for i, t in enumerate(micro):
        ids[i, :t.num_tokens] = t.token_ids
        attn[i, :t.num_tokens] = 1
        span = _response_columns(t)
        mask[i, span] = t.loss_mask
        rollout_lp[i, span] = t.rollout_logprobs
        if t.advantages is not None:
            adv[i, span] = t.advantages
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": mask, "advantages": adv,
             "rollout_logprobs": rollout_lp}
    if any(t.teacher_topm_ids is not None for t in micro):
        batch.update(_collate_teacher(micro, length))
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}


def _response_columns(t: Trajectory) -> slice:
    start = len(t.prompt_ids) - 1
    return slice(start, start + len(t.response_ids))


def _collate_teacher(micro: list[Trajectory], length: int) -> dict[str, np.ndarray]:
    """The teacher's top-M indices and log-probs and its log-prob of the sampled token (and, for a full-vocabulary
    divergence, its last hidden state) at each response token, in the same layout; `distill_mask` weighs the action
    tokens that have a teacher signal (1, or the algorithm's `distill_weights`)."""
    M = max(t.teacher_topm_ids.shape[1] for t in micro if t.teacher_topm_ids is not None)
    idx = np.zeros((len(micro), length - 1, M), dtype=np.int64)
    logp = np.zeros((len(micro), length - 1, M), dtype=np.float32)
    has, sampled = (np.zeros((len(micro), length - 1), dtype=np.float32) for _ in range(2))
    for i, t in enumerate(micro):
        if t.teacher_topm_ids is None:
            continue
        span = _response_columns(t)
        idx[i, span] = t.teacher_topm_ids
        logp[i, span] = t.teacher_topm_logprobs
        sampled[i, span] = t.teacher_logprobs
        has[i, span] = t.loss_mask if t.distill_weights is None else t.distill_weights
    batch = {"teacher_topm_ids": idx, "teacher_topm_logprobs": logp, "teacher_logprobs": sampled, "distill_mask": has}
    if any(t.teacher_hidden is not None for t in micro):
        width = next(t.teacher_hidden.shape[1] for t in micro if t.teacher_hidden is not None)
        batch["teacher_hidden"] = np.zeros((len(micro), length - 1, width), dtype=np.float32)
        for i, t in enumerate(micro):
            if t.teacher_hidden is not None:
                batch["teacher_hidden"][i, _response_columns(t)] = t.teacher_hidden
    return batch


def response_values(micro: list[Trajectory], values_BT: torch.Tensor) -> list[np.ndarray]:
    """Inverse of the layout in `collate`: per trajectory, the values at its response tokens ([R] or [R, K])."""
    values = values_BT.detach().cpu().numpy()
    return [values[i, _response_columns(t)] for i, t in enumerate(micro)]


class TokenLogProbModel(torch.nn.Module):
    """A causal LM whose forward returns `token_logprobs`: the module given to DeepSpeed, so that every forward
    goes through the engine (ZeRO's gradient accumulation bookkeeping runs there)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids_BT, attention_mask_BT, chunk_tokens: int, temperature: float, num_chunks: int,
                extra_index_BTM=None, teacher: Optional[FullVocabTeacher] = None):
        return token_logprobs_at(self.lm, input_ids_BT, attention_mask_BT, chunk_tokens, temperature, num_chunks,
                                 extra_index_BTM, teacher)


@torch.no_grad()
def hidden_topk(head: torch.nn.Module, hidden_BTH: torch.Tensor, k: int, chunk_tokens: int,
                temperature: float = 1.0, num_chunks: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens at each position and their log-probs ([B, T, k] each), chunk by chunk
    (`num_chunks` as in `hidden_logprobs`)."""
    ids, logps = [], []
    needed = -(-hidden_BTH.shape[1] // chunk_tokens)
    for start in range(0, max(needed, num_chunks or 0) * chunk_tokens, chunk_tokens):
        logits = head(hidden_BTH[:, start:start + chunk_tokens]).float() / temperature
        top = torch.topk(logits, k, dim=-1)
        ids.append(top.indices)
        logps.append(top.values - torch.logsumexp(logits, dim=-1, keepdim=True))
    return torch.cat(ids, dim=1), torch.cat(logps, dim=1)
