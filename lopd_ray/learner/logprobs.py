"""Per-token log-probs from a causal LM without materializing [T, V] logits for the whole sequence.

The decoder runs once; the output head and log-softmax run chunk by chunk under activation checkpointing, so
only one [chunk, V] block of logits is alive at a time, in the forward and in the backward pass.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from lopd_ray.data.trajectory import Trajectory


def _chunk_logprobs(head: torch.nn.Module, hidden_BTH: torch.Tensor, index_BTK: torch.Tensor, temperature: float):
    logits = head(hidden_BTH).float() / temperature
    return logits.gather(-1, index_BTK) - torch.logsumexp(logits, dim=-1, keepdim=True)


def hidden_logprobs(head: torch.nn.Module, hidden_BTH: torch.Tensor, index_BTK: torch.Tensor, chunk_tokens: int,
                    temperature: float = 1.0, num_chunks: int | None = None) -> torch.Tensor:
    """[B, T, K] log-softmax(head(hidden) / temperature) at `index`, one [chunk, V] block of logits at a time.

    `num_chunks` (at least what T needs) makes the head run that many times, empty chunks included, so that
    data-parallel ranks with different lengths make the same sequence of module calls."""
    needed = -(-hidden_BTH.shape[1] // chunk_tokens)
    out = []
    for start in range(0, max(needed, num_chunks or 0) * chunk_tokens, chunk_tokens):
        h, idx = hidden_BTH[:, start:start + chunk_tokens], index_BTK[:, start:start + chunk_tokens]
        if torch.is_grad_enabled():
            out.append(checkpoint(_chunk_logprobs, head, h, idx, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(head, h, idx, temperature))
    return torch.cat(out, dim=1)


def token_logprobs_at(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, chunk_tokens: int,
                      temperature: float = 1.0, num_chunks: int | None = None,
                      extra_index_BTM: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T-1, 1+M]: column 0 is log p(input_ids[:, t+1] | prefix); columns 1.. are the log-probs at
    `extra_index` (e.g. a teacher's top-M tokens) at the same positions."""
    hidden_BTH = model.get_decoder()(input_ids=input_ids_BT, attention_mask=attention_mask_BT).last_hidden_state
    index_BTK = input_ids_BT[:, 1:].unsqueeze(-1)
    if extra_index_BTM is not None:
        index_BTK = torch.cat([index_BTK, extra_index_BTM], dim=-1)
    return hidden_logprobs(model.get_output_embeddings(), hidden_BTH[:, :-1], index_BTK, chunk_tokens, temperature,
                           num_chunks)


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, chunk_tokens: int,
                   temperature: float = 1.0, num_chunks: int | None = None) -> torch.Tensor:
    """[B, T-1] log p(input_ids[:, t+1] | input_ids[:, :t+1])."""
    return token_logprobs_at(model, input_ids_BT, attention_mask_BT, chunk_tokens, temperature, num_chunks)[..., 0]


def collate(micro: list[Trajectory], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded tensors aligned with `token_logprobs`' output: column t scores token t+1."""
    length = max(t.num_tokens for t in micro)
    B = len(micro)
    ids = torch.full((B, length), pad_id, dtype=torch.long)
    attn = torch.zeros((B, length), dtype=torch.long)
    mask = torch.zeros((B, length - 1), dtype=torch.float32)
    adv = torch.zeros((B, length - 1), dtype=torch.float32)
    rollout_lp = torch.zeros((B, length - 1), dtype=torch.float32)
    for i, t in enumerate(micro):
        seq = t.prompt_ids + t.response_ids
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        span = slice(len(t.prompt_ids) - 1, len(seq) - 1)
        mask[i, span] = torch.tensor(t.loss_mask, dtype=torch.float32)
        rollout_lp[i, span] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
        if t.advantages is not None:
            adv[i, span] = torch.tensor(t.advantages, dtype=torch.float32)
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": mask, "advantages": adv,
             "rollout_logprobs": rollout_lp}
    if any(t.teacher_topm_ids is not None for t in micro):
        batch.update(_collate_teacher(micro, length))
    return {k: v.to(device) for k, v in batch.items()}


def _collate_teacher(micro: list[Trajectory], length: int) -> dict[str, torch.Tensor]:
    """The teacher's top-M indices and log-probs at each response token, in the same layout; `distill_mask`
    is 1 on action tokens that have a teacher signal."""
    M = max(len(row) for t in micro if t.teacher_topm_ids for row in t.teacher_topm_ids)
    idx = torch.zeros((len(micro), length - 1, M), dtype=torch.long)
    logp = torch.zeros((len(micro), length - 1, M), dtype=torch.float32)
    has = torch.zeros((len(micro), length - 1), dtype=torch.float32)
    for i, t in enumerate(micro):
        if t.teacher_topm_ids is None:
            continue
        start = len(t.prompt_ids) - 1
        end = start + len(t.response_ids)
        idx[i, start:end] = torch.tensor(t.teacher_topm_ids, dtype=torch.long)
        logp[i, start:end] = torch.tensor(t.teacher_topm_logprobs, dtype=torch.float32)
        has[i, start:end] = torch.tensor(t.loss_mask, dtype=torch.float32)
    return {"teacher_topm_ids": idx, "teacher_topm_logprobs": logp, "distill_mask": has}


def response_values(micro: list[Trajectory], values_BT: torch.Tensor) -> list[list[float]]:
    """Inverse of the layout in `collate`: per trajectory, the values at its response tokens."""
    out = []
    for i, t in enumerate(micro):
        start = len(t.prompt_ids) - 1
        out.append(values_BT[i, start:start + len(t.response_ids)].tolist())
    return out


class TokenLogProbModel(torch.nn.Module):
    """A causal LM whose forward returns `token_logprobs`: the module given to DeepSpeed, so that every forward
    goes through the engine (ZeRO's gradient accumulation bookkeeping runs there)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids_BT, attention_mask_BT, chunk_tokens: int, temperature: float, num_chunks: int,
                extra_index_BTM=None):
        return token_logprobs_at(self.lm, input_ids_BT, attention_mask_BT, chunk_tokens, temperature, num_chunks,
                                 extra_index_BTM)


@torch.no_grad()
def hidden_topk(head: torch.nn.Module, hidden_BTH: torch.Tensor, k: int, chunk_tokens: int,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens at each position and their log-probs ([B, T, k] each), chunk by chunk."""
    ids, logps = [], []
    for start in range(0, hidden_BTH.shape[1], chunk_tokens):
        logits = head(hidden_BTH[:, start:start + chunk_tokens]).float() / temperature
        top = torch.topk(logits, k, dim=-1)
        ids.append(top.indices)
        logps.append(top.values - torch.logsumexp(logits, dim=-1, keepdim=True))
    return torch.cat(ids, dim=1), torch.cat(logps, dim=1)
