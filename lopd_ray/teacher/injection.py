"""The teacher's prompt: the student's conversation with the privileged context placed in it, rendered with the
student's own chat template; latent injection (METHOD.md 2.3); the student <-> teacher position alignment.

A text context is placed in the messages and the whole conversation rendered and tokenized once, so an empty
context gives exactly the student's prompt (`agent_loop.render_ids`). A latent context holds LATENT_SLOT once: the
render is split on it, the halves tokenized, and placeholder ids inserted; at the embedding layer the placeholder
rows are replaced by the latents.
"""
from __future__ import annotations

import numpy as np
import torch

from lopd_ray.data.trajectory import TeacherContext

LATENT_SLOT = "\ue000LOPD_LATENT_BLOCK\ue000"  # private-use characters: never in task text


def latent_context(composer_cfg) -> TeacherContext:
    """LOPD's context: the latent block between the composer's framing texts, before the first user message."""
    return TeacherContext(composer_cfg.framing_before + LATENT_SLOT + composer_cfg.framing_after, "user_prefix")


def place_context(messages: list[dict], context: TeacherContext) -> list[dict]:
    """The conversation the teacher sees: `messages` with the context placed; an empty text changes nothing."""
    if not context.text:
        return messages
    messages = [dict(m) for m in messages]
    if context.placement == "system":
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] += context.text
        else:
            messages.insert(0, {"role": "system", "content": context.text})
        return messages
    first = next((m for m in messages if m["role"] == "user"), None)
    if first is None:
        raise ValueError("the conversation has no user message to place the teacher's context in")
    before = context.placement == "user_prefix"
    first["content"] = context.text + first["content"] if before else first["content"] + context.text
    return messages


def teacher_prompt_ids(tokenizer, messages: list[dict], context: TeacherContext, num_latents: int,
                       placeholder_id: int) -> tuple[list[int], slice]:
    """-> (teacher prompt ids, the slice of the `num_latents` placeholder ids in them; empty without latents).

    For a latent context with no latents and empty framing this is the student's prompt as long as the first user
    message's start is a pre-tokenizer boundary, which holds for ChatML templates ("...user\\n" then the content)
    unless the content itself starts with a newline."""
    text = tokenizer.apply_chat_template(place_context(messages, context), add_generation_prompt=True,
                                         tokenize=False)
    halves = text.split(LATENT_SLOT)
    if len(halves) == 1 and num_latents == 0:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids, slice(len(ids), len(ids))
    if len(halves) != 2:
        raise ValueError(f"the rendered teacher prompt holds the latent slot {len(halves) - 1} times, not once")
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
