"""Latent injection into the teacher (METHOD.md 2.3) and the student <-> teacher position alignment.

The teacher prompt is the student prompt with `framing_before + [J*K latent slots] + framing_after` placed at the
start of the first user message. The chat is rendered with a sentinel, split on it, the halves tokenized, and
placeholder ids inserted; at the embedding layer the placeholder rows are replaced by the latents.
"""
from __future__ import annotations

import numpy as np
import torch

SENTINEL = "\ue000LOPD_LATENT_BLOCK\ue000"  # private-use characters: never in task text


def teacher_prompt_ids(tokenizer, messages: list[dict], num_latents: int, framing_before: str, framing_after: str,
                       placeholder_id: int) -> tuple[list[int], slice]:
    """-> (teacher prompt ids, the slice of the `num_latents` placeholder ids in them).

    With num_latents=0 and empty framing this is the student's prompt (`agent_loop.render_ids` of `messages`), as
    long as the first user message's start is a pre-tokenizer boundary, which holds for ChatML templates ("...user\\n"
    then the content) unless the content itself starts with a newline."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise ValueError("the conversation has no user message to place the latent block in")
    messages = [dict(m) for m in messages]
    first = messages[users[0]]
    first["content"] = framing_before + SENTINEL + framing_after + first["content"]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    halves = text.split(SENTINEL)
    if len(halves) != 2:
        raise ValueError(f"the rendered teacher prompt holds the latent sentinel {len(halves) - 1} times, not once")
    before = tokenizer(halves[0], add_special_tokens=False)["input_ids"]
    after = tokenizer(halves[1], add_special_tokens=False)["input_ids"]
    return before + [placeholder_id] * num_latents + after, slice(len(before), len(before) + num_latents)


def embed_with_latents(model, input_ids_BT: torch.Tensor, latent_slices: list[slice],
                       latents_list: list[torch.Tensor]) -> torch.Tensor:
    """Token embeddings [B, T, d] with row b's `latent_slices[b]` positions replaced by `latents_list[b]` [L_b, d].

    Built by concatenation, not in-place writes, so gradients reach the latents."""
    embeds_BTd = model.get_input_embeddings()(input_ids_BT)
    rows = []
    for embeds_Td, span, latents_Ld in zip(embeds_BTd, latent_slices, latents_list, strict=True):
        if span.stop - span.start != latents_Ld.shape[0]:
            raise ValueError(f"latent slice {span} has {span.stop - span.start} positions but "
                             f"{latents_Ld.shape[0]} latents were given")
        rows.append(torch.cat([embeds_Td[:span.start], latents_Ld.to(embeds_Td.dtype), embeds_Td[span.stop:]]))
    return torch.stack(rows)


def teacher_sequence(prompt_ids_teacher: list[int], response_ids) -> list[int]:
    """The sequence the teacher scores: its own prompt, then the student's response tokens unchanged."""
    return list(prompt_ids_teacher) + np.asarray(response_ids).tolist()


def response_positions(teacher_prompt_len: int, response_len: int) -> torch.Tensor:
    """[R] positions of the teacher's logits that score response tokens 0..R-1 (position p scores token p+1).

    The same indices select the response in `token_logprobs`' [B, T-1] output (column t scores token t+1); the
    student's come from `len(prompt_ids) - 1`, so teacher positions = student positions + (teacher - student
    prompt length)."""
    start = teacher_prompt_len - 1
    return torch.arange(start, start + response_len)
