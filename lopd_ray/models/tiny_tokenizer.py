"""Trains the byte-level BPE tokenizer of the built-in tiny models, offline, from a synthetic corpus.

The result is committed under assets/tiny_tokenizer/; rerun `python -m lopd_ray.models.tiny_tokenizer` only to
change it.
"""
from __future__ import annotations

import json
import os
import random
from typing import Optional

ASSET_DIR = os.path.join(os.path.dirname(__file__), "assets", "tiny_tokenizer")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ("the a an of to and in is it you that he was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said each she which do their time "
         "if will way about many then them write would like so these her long make thing see him two has look more "
         "day could go come did number sound no most people my over know water than call first who may down side "
         "been now find any new work part take get place made live where after back little only round man year came "
         "show every good me give our under name very through just form sentence great think say help low line "
         "reply letter repeated times answer task solve call tool result error file print return def if else").split()


def synthetic_corpus(seed: int = 0, lines: int = 20000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.3:
            out.append(rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(1, 12))
        elif kind < 0.5:
            out.append(f"Reply with the letter '{rng.choice('abcdefgh')}' repeated {rng.randint(1, 12)} times.")
        elif kind < 0.7:
            out.append(" ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(1, 6))))
        else:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))).capitalize() + ".")
    return out


def train(vocab_size: int = 1024, out_dir: str = ASSET_DIR, corpus: Optional[list[str]] = None) -> None:
    """A byte-level BPE of `vocab_size` tokens trained on `corpus` (default: the synthetic one), with the chat
    template and special tokens of the tiny models, written to `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus or synthetic_corpus(), trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 4096,
              "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f, indent=2)


if __name__ == "__main__":
    train()
    print(f"wrote {ASSET_DIR}")
