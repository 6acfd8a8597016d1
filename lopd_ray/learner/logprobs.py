"""Per-token log-probs from a causal LM without materializing [T, V] logits for the whole sequence.

The decoder runs once; the output head and log-softmax run chunk by chunk under activation checkpointing, so
only one [chunk, V] block of logits is alive at a time, in the forward and in the backward pass.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from lopd_ray.data.trajectory import Trajectory


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float):
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, chunk_tokens: int,
                   temperature: float = 1.0, num_chunks: int | None = None) -> torch.Tensor:
    """[B, T-1] log p(input_ids[:, t+1] | input_ids[:, :t+1]).

    `num_chunks` (at least what T needs) makes the head run that many times, empty chunks included, so that
    data-parallel ranks with different lengths make the same sequence of module calls."""
    hidden_BTH = model.get_decoder()(input_ids=input_ids_BT, attention_mask=attention_mask_BT).last_hidden_state
    head = model.get_output_embeddings()
    targets_BT = input_ids_BT[:, 1:]
    hidden_BTH = hidden_BTH[:, :-1]
    needed = -(-hidden_BTH.shape[1] // chunk_tokens)
    out = []
    for start in range(0, max(needed, num_chunks or 0) * chunk_tokens, chunk_tokens):
        h, tgt = hidden_BTH[:, start:start + chunk_tokens], targets_BT[:, start:start + chunk_tokens]
        if torch.is_grad_enabled():
            out.append(checkpoint(_chunk_logprobs, head, h, tgt, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(head, h, tgt, temperature))
    return torch.cat(out, dim=1)


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
    to = lambda x: x.to(device)
    return {"input_ids": to(ids), "attention_mask": to(attn), "loss_mask": to(mask), "advantages": to(adv),
            "rollout_logprobs": to(rollout_lp)}


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

    def forward(self, input_ids_BT, attention_mask_BT, chunk_tokens: int, temperature: float, num_chunks: int):
        return token_logprobs(self.lm, input_ids_BT, attention_mask_BT, chunk_tokens, temperature, num_chunks)
