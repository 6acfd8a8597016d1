"""Greedy episodes of a model under a teacher's context, its prompt built exactly as for scoring
(`teacher_prompt_ids` + `embed_with_latents`): the study's gate and the teacher's held-out evaluation
(`TeacherWorker.play_held_out`) both play them here. Multi-turn envs get the env's replies appended to the
conversation while the context stays where it was placed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from lopd_ray.data.trajectory import TeacherContext
from lopd_ray.teacher.injection import embed_with_latents, teacher_prompt_ids


@dataclass
class Episode:
    """A greedy episode: each agent turn as (the conversation before it, its token ids), the reward, the texts."""
    turns: list[tuple[list[dict], list[int]]]
    reward: float
    texts: list[str]


def prompt_embeds(model, tokenizer, messages: list[dict], context: TeacherContext, latents_Ld: torch.Tensor,
                  placeholder_id: int) -> torch.Tensor:
    """The input embeddings [1, T, d] of the conversation's next turn with `context` placed in it and `latents_Ld`
    ([L, d], L = 0 for a text context) in its latent slot."""
    ids, span = teacher_prompt_ids(tokenizer, messages, context, latents_Ld.shape[0], placeholder_id)
    device = model.get_input_embeddings().weight.device
    return embed_with_latents(model, torch.tensor([ids], device=device), [span], [latents_Ld.to(device)])


def greedy_answer(model, tokenizer, embeds: torch.Tensor, max_new_tokens: int) -> list[int]:
    """The model's greedy continuation of `embeds` [1, T, d], up to and with its end-of-sequence token."""
    out = model.generate(inputs_embeds=embeds, attention_mask=embeds.new_ones(embeds.shape[:2], dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    ids = out[0].tolist()
    return ids[:ids.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in ids else ids


def play(task, new_env: Callable, answer: Callable[[list[dict]], list[int]], tokenizer) -> Episode:
    """One episode of `task` in a fresh env, each turn `answer(conversation so far)`; no end within the env's
    max_turns scores 0."""
    env = new_env()
    env.reset(task)
    messages, episode = list(task.messages), Episode([], 0.0, [])
    for _ in range(env.max_turns):
        ids = answer(messages)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        episode.turns.append((messages, ids))
        episode.texts.append(text)
        result = env.step(text)
        if result.done:
            episode.reward = result.reward
            break
        messages = messages + [{"role": "assistant", "content": text}] + result.observation
    return episode


def greedy_episode(model, tokenizer, task, new_env: Callable, context: TeacherContext, latents_Ld: torch.Tensor,
                   max_new_tokens: int, placeholder_id: int) -> Episode:
    """A greedy episode of `task` by `model` as the teacher under `context` (and latents)."""
    def answer(messages: list[dict]) -> list[int]:
        embeds = prompt_embeds(model, tokenizer, messages, context, latents_Ld, placeholder_id)
        return greedy_answer(model, tokenizer, embeds, max_new_tokens)
    return play(task, new_env, answer, tokenizer)
