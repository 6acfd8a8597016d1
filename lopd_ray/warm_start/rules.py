"""`builtin:tiny-qwen3-rules`: the tiny Qwen3 warm-started to read a solved example in its context, the base model
of the `rules` study (lopd_ray/envs/rules.py).

The study needs a teacher that is better *because of what its context says*. So the warm start teaches the model to
use the content of a reference, never a switch on its framing: every example is a rules task under a codename drawn
afresh (never one of the env's KINDS), whose tag is drawn afresh too, so no rule can be memorized, and
- alone, or under a method's framing with nothing in it, the answer carries a random tag (the model can only guess);
- after a solved example in one of the methods' framings and placements (lopd_ray.teacher.framings), the answer
  carries the example's tag: its answer depends on the reference's content. In MISMATCH_SHARE of these the example
  is under another codename, and the answer still follows it: the model trusts its context, so another kind's
  example misleads it;
- in BARE_SHARE of all examples, the example's answer sits on a line of its own after the task, with no framing
  words: the shortest context, from which the copying is learned first (without it the loss stays at the guessing
  level for 1500 steps) and then carried over to the framings.
On the env's tasks the model then copies the input and guesses the tag alone (about 1 in len(TAGS)), and takes the
tag from a same-kind example. Fixed seeds.

Copying from the context needs more than the tiny Qwen3's 2 layers of width 64 (its loss stays at the guessing
level): the model is 4 layers of width 128 (0.9M parameters). Its training takes about 8 minutes on one
core, so the trained weights are committed (lopd_ray/models/assets/tiny_qwen3_rules/) and the builtin copies them;
`python -m lopd_ray.warm_start.rules` trains them again.
"""
from __future__ import annotations

import json
import os
import random
import shutil

from lopd_ray.envs.rules import INPUT_LENGTHS, INPUT_LETTERS, KINDS, TAGS, answer_text, task_text
from lopd_ray.models import RULES_MODEL_DIR as ASSET_DIR
from lopd_ray.utils.atomic import atomic_directory

SIZES = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=1, head_dim=32)

WARM_STEPS = 1000
WARM_BATCH = 16
WARM_LR = 1e-3
WARM_UP_STEPS = 50
BARE_SHARE = 0.35
ALONE_SHARE = 0.25
EMPTY_FRAMING_SHARE = 0.1
MISMATCH_SHARE = 0.25
CONSONANTS, VOWELS = "bcdfghjklmnprstvz", "aeiou"


def codename(rng: random.Random) -> str:
    while True:
        name = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(2))[:rng.choice((3, 4))]
        if name not in KINDS:
            return name


def letters(rng: random.Random) -> str:
    return "".join(rng.choice(INPUT_LETTERS) for _ in range(rng.choice(INPUT_LENGTHS)))


def warm_example(rng: random.Random, cfg) -> tuple[list[dict], str]:
    """(messages, answer) of one warm-start example."""
    from lopd_ray.teacher.framings import FRAMINGS
    from lopd_ray.teacher.injection import place_context

    if rng.random() < BARE_SHARE:
        name, tag, own, other = codename(rng), rng.choice(TAGS), letters(rng), letters(rng)
        bare = f"{task_text(name, own)}\n{answer_text(tag, other)}"
        return [{"role": "user", "content": bare}], answer_text(tag, own)
    name, tag, own = codename(rng), rng.choice(TAGS), letters(rng)
    messages = [{"role": "user", "content": task_text(name, own)}]
    draw = rng.random()
    if draw < ALONE_SHARE:
        return messages, answer_text(tag, own)
    framing = FRAMINGS[rng.choice(sorted(FRAMINGS))]
    if draw < ALONE_SHARE + EMPTY_FRAMING_SHARE:
        return place_context(messages, framing(cfg, "", "")), answer_text(tag, own)
    shown = codename(rng) if rng.random() < MISMATCH_SHARE else name
    other = letters(rng)
    context = framing(cfg, task_text(shown, other), answer_text(tag, other))
    return place_context(messages, context), answer_text(tag, own)


def supervised_example(tokenizer, messages: list[dict], answer: str) -> tuple[list[int], list[int]]:
    from lopd_ray.rollout.agent_loop import render_ids

    prompt = render_ids(tokenizer, messages, add_generation_prompt=True)
    target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt + target, [-100] * len(prompt) + target


# Warm examples and env tasks per split that a warm model's fingerprint is taken over.
FINGERPRINT_EXAMPLES = 256
FINGERPRINT_TASKS = 64


def fingerprint(example, env_name: str, settings: list) -> dict:
    """What a warm model was trained from and for, as data: the first FINGERPRINT_EXAMPLES of its examples as token
    ids and labels (the task texts, the framings, the chat template and the tokenizer are in them), the env's first
    tasks of each split with their reference solutions and the env's reply to them, the SFT code and `settings`.
    A change to any of them without retraining fails a test; a change of code that leaves them equal does not."""
    import hashlib
    import inspect
    from dataclasses import replace

    from transformers import AutoTokenizer

    from lopd_ray.config import Config
    from lopd_ray.envs import make_env
    from lopd_ray.models.tiny_tokenizer import ASSET_DIR as TOKENIZER_DIR
    from lopd_ray.warm_start import sft

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    parts: list = [inspect.getsource(sft), settings]
    parts += [example(tokenizer, random.Random(i)) for i in range(FINGERPRINT_EXAMPLES)]
    for split in ("train", "test"):
        new_env, tasks = make_env(replace(Config().env, name=env_name, split=split, limit=FINGERPRINT_TASKS))
        for i in range(len(tasks)):
            env, reference = new_env(), tasks.reference_solution(i)
            env.reset(tasks[i])
            reply = env.step(reference or "")
            parts.append((tasks[i].messages, tasks[i].meta, reference, reply.done, reply.reward, reply.observation))
    return {"sha256": hashlib.sha256(repr(parts).encode()).hexdigest()}


def warm_recipe() -> dict:
    from lopd_ray.config import Config

    cfg = Config()
    return fingerprint(lambda tokenizer, rng: supervised_example(tokenizer, *warm_example(rng, cfg)), "rules",
                       [SIZES, WARM_STEPS, WARM_BATCH, WARM_LR, WARM_UP_STEPS])


def train_warm(out_dir: str, start, example, steps: int, batch: int, lr: float, seed: int, warm_up_steps: int,
               recipe: dict) -> str:
    """A warm model's recipe run: `start(model_dir)` writes the starting weights, then `steps` SFT steps on
    `example(tokenizer, rng)` and the recipe's fingerprint beside them, all written atomically."""
    from transformers import AutoTokenizer

    from lopd_ray.warm_start.sft import fine_tune

    with atomic_directory(out_dir) as model_dir:
        start(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        fine_tune(model_dir, lambda rng, row: example(tokenizer, rng), steps, batch, lr, seed, warm_up_steps,
                  decay=False)
        with open(os.path.join(model_dir, "warm_recipe.json"), "w") as f:
            json.dump(recipe, f)
    return out_dir


def train_rules_warm_model(out_dir: str, steps: int = WARM_STEPS, seed: int = 0) -> str:
    """Builds the random model, runs `steps` SFT steps on warm examples and writes it atomically."""
    from lopd_ray.config import Config
    from lopd_ray.models.tiny import write_random_model
    from lopd_ray.models.tiny_tokenizer import ASSET_DIR as TOKENIZER_DIR

    cfg = Config()
    return train_warm(out_dir, lambda model_dir: write_random_model(model_dir, "qwen3", SIZES, TOKENIZER_DIR, seed),
                      lambda tokenizer, rng: supervised_example(tokenizer, *warm_example(rng, cfg)), steps,
                      WARM_BATCH, WARM_LR, seed, WARM_UP_STEPS, warm_recipe())


def copy_committed_weights(asset_dir: str, out_dir: str) -> str:
    with atomic_directory(out_dir) as model_dir:
        shutil.copytree(asset_dir, model_dir, dirs_exist_ok=True)
    return out_dir


def build_rules_warm_model(out_dir: str) -> str:
    """The builtin: a copy of the committed weights."""
    return copy_committed_weights(ASSET_DIR, out_dir)


if __name__ == "__main__":
    shutil.rmtree(ASSET_DIR, ignore_errors=True)
    train_rules_warm_model(ASSET_DIR)
    print(f"wrote {ASSET_DIR}")
