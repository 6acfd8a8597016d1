"""A character-level ChatML tokenizer and an engine that answers from a script: the real agent loop without a
model."""
from __future__ import annotations

from lopd_ray.rollout.engines.base import Generation

EOS, END_TAG = 1, "<|im_end|>"


class CharTokenizer:
    eos_token_id = EOS

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}{END_TAG}\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids = []
        for i, part in enumerate(text.split(END_TAG)):
            ids += ([EOS] if i else []) + [ord(c) + 10 for c in part]
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i - 10) if i != EOS else ("" if skip_special_tokens else END_TAG) for i in ids)


class ScriptedEngine:
    """Answers every episode's turn t with script[t]."""

    def __init__(self, script: list[str]):
        self.script, self.turn = script, 0

    def generate(self, prompts, specs):
        text = self.script[self.turn]
        self.turn += 1
        ids = [ord(c) + 10 for c in text] + [EOS]
        return [Generation(ids, [0.0] * len(ids), "stop") for _ in prompts]
