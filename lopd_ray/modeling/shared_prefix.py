"""A decoder forward over a batch whose rows begin alike, computed as a tree: what every row begins with runs once,
what the rows of a group share (the samples of one prompt) runs once per group on that, and each row runs only its
own tail on its group's key/value cache. The hidden states equal the plain forward's up to float error, and
gradients reach the shared parts through the caches."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class SharedLayout:
    """Which positions of a right-padded batch are shared: [0, prefix) by all rows; [prefix, split[b]) by the rows of
    row b's group (`group[b]`, numbered from 0); [split[b], length[b]) is row b's own."""
    prefix: int
    group: list[int]
    split: list[int]
    length: list[int]

    def saves_work(self) -> bool:
        return self.prefix > 0 or len(set(self.group)) < len(self.group)


def layout(ids: torch.Tensor, length: list[int], split: list[int], row_keys: list, limit: int) -> SharedLayout:
    """The layout of a batch of token ids [B, T]: rows with equal `row_keys` share their first `split` positions
    (the caller vouches that those positions are equal); all rows share the longest common run of ids, at most
    `limit` positions (positions whose embeddings are not their ids' must lie past it), and every group keeps at
    least one position of its own before its split."""
    limit = min(limit, min(split) - 1) if split else 0
    prefix = 0
    if ids.shape[0] > 1 and limit > 0:
        differs = (ids[:, :limit] != ids[:1, :limit]).any(dim=0)
        prefix = int(differs.nonzero()[0, 0]) if differs.any() else limit
    numbering: dict = {}
    group = [numbering.setdefault(key, len(numbering)) for key in row_keys]
    return SharedLayout(prefix, group, split, length)


def shared_micro_batches(prompt_lengths: list[int], response_lengths: list[int], keys: list,
                         max_tokens: int) -> list[list[int]]:
    """Positions 0..n-1 in order, cut into consecutive groups whose shared forward's padded size stays within
    `max_tokens`: distinct keys (prompts) x the longest prompt, plus members x the longest response (a single
    larger item gets a group of its own)."""
    groups: list[list[int]] = []
    for i, (prompt, response, key) in enumerate(zip(prompt_lengths, response_lengths, keys, strict=True)):
        if groups:
            members = groups[-1] + [i]
            size = (len({keys[j] for j in members}) * max(prompt_lengths[j] for j in members)
                    + len(members) * max(response_lengths[j] for j in members))
            if size <= max_tokens:
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def decode(decoder: torch.nn.Module, embeds: torch.Tensor, shared: SharedLayout) -> torch.Tensor:
    """The decoder's last hidden states [B, T, d] of right-padded `embeds` [B, T, d] laid out as `shared` says.
    Each stage reads its inputs and the result is assembled with one gather (a slice per row would cost a
    full-size zero tensor per row in the backward); padded places read position 0, which the masks leave out."""
    rows, width, device = embeds.shape[0], embeds.shape[1], embeds.device
    P = shared.prefix
    first_row = {g: b for b, g in reversed(list(enumerate(shared.group)))}
    groups = len(first_row)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    outputs, offset, source = [], 0, [[0] * width for _ in range(rows)]  # source: a row of cat(outputs) per place
    if P:
        out = decoder(inputs_embeds=embeds[:1, :P], attention_mask=torch.ones(1, P, dtype=torch.long, device=device),
                      use_cache=True)
        outputs.append(out.last_hidden_state[0])
        kv = [(layer.keys.expand(groups, -1, -1, -1), layer.values.expand(groups, -1, -1, -1))
              for layer in out.past_key_values.layers]
        for b in range(rows):
            source[b][:P] = range(P)
        offset = P

    middle_lengths = [shared.split[first_row[g]] - P for g in range(groups)]
    M = max(middle_lengths)
    middle_mask = _right_padded_mask(middle_lengths, P, device)
    out = decoder(inputs_embeds=embeds[_index([first_row[g] for g in range(groups)], [P] * groups, middle_lengths, M,
                                              device)],
                  attention_mask=middle_mask, past_key_values=DynamicCache(kv) if P else None, use_cache=True)
    outputs.append(out.last_hidden_state.reshape(-1, embeds.shape[-1]))
    for b in range(rows):
        g = shared.group[b]
        source[b][P:shared.split[b]] = range(offset + g * M, offset + g * M + middle_lengths[g])
    offset += groups * M
    row_group = torch.tensor(shared.group, device=device)
    kv = [(layer.keys[row_group], layer.values[row_group]) for layer in out.past_key_values.layers]

    tail_lengths = [shared.length[b] - shared.split[b] for b in range(rows)]
    R = max(tail_lengths)
    if R > 0:
        mask = torch.cat([middle_mask[row_group], _right_padded_mask(tail_lengths, 0, device)], dim=1)
        positions = torch.tensor(shared.split, device=device)[:, None] + torch.arange(R, device=device)
        out = decoder(inputs_embeds=embeds[_index(range(rows), shared.split, tail_lengths, R, device)],
                      attention_mask=mask, position_ids=positions, past_key_values=DynamicCache(kv), use_cache=True)
        outputs.append(out.last_hidden_state.reshape(-1, embeds.shape[-1]))
        for b in range(rows):
            source[b][shared.split[b]:shared.length[b]] = range(offset + b * R, offset + b * R + tail_lengths[b])
    return torch.cat(outputs)[torch.tensor(source, device=device)]


def _index(rows, starts: list[int], lengths: list[int], width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Advanced indices [N, width] that read `lengths[n]` positions from `starts[n]` of row `rows[n]` (position 0
    past them)."""
    offsets = torch.arange(width, device=device)[None]
    inside = offsets < torch.tensor(lengths, device=device)[:, None]
    positions = torch.where(inside, torch.tensor(starts, device=device)[:, None] + offsets, 0)
    return torch.tensor(list(rows), device=device)[:, None].expand(-1, width), positions


def _right_padded_mask(lengths: list[int], prefix: int, device) -> torch.Tensor:
    """[N, prefix + max(lengths)]: 1 over the shared prefix and each row's first lengths[n] positions after it."""
    width = max(lengths) if lengths else 0
    mask = (torch.arange(width, device=device)[None] < torch.tensor(lengths, device=device)[:, None]).long()
    return torch.cat([torch.ones(len(lengths), prefix, dtype=torch.long, device=device), mask], dim=1)
