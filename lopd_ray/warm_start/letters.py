"""`builtin:tiny-<arch>-letters`: the tiny model warm-started on `letters` as a weak zero-shot, strong few-shot
solver, the base model of the LOPD demo.

Self-distillation needs a teacher that context can make better than the student. A random tiny model cannot be
one: its next-token distribution is nearly uniform whatever its context (measured: a freely optimized soft prompt
moves its answer NLL by under 1%). Pretrained LLMs are the opposite (a reference example in the prompt helps them),
so the warm-up reproduces that regime in seconds on one CPU core: supervised steps on letters tasks where the
prompt either (half the time) holds a reference example of another solved task, framed as the LOPD teacher frames
its latent block, followed by a clean answer; or holds the task alone, followed by a sloppy answer (the asked
letters mixed with stray ones). Deterministic (fixed seeds).
"""
from __future__ import annotations

import random

from lopd_ray.utils.atomic import atomic_directory

WARM_START_STEPS = 400
WARM_START_BATCH = 16
WARM_START_LR = 3e-3
STRAY_LETTERS = "xyzqkw"


def sloppy_answer(letter: str, count: int, rng: random.Random) -> str:
    """The asked letter `count` times with about as many stray letters mixed in (letters reward about 0.5)."""
    chars = [letter] * count + [rng.choice(STRAY_LETTERS) for _ in range(rng.randint(count // 2, count))]
    rng.shuffle(chars)
    return "".join(chars)


def warm_start_example(tasks, index: int, with_reference: bool, rng: random.Random, framing: tuple[str, str]):
    """(messages, answer) for one task: with a reference example of another task and a clean answer, or alone with
    a sloppy one."""
    from lopd_ray.bank.traces import composer_input_text_of, observation_lite_trace
    task = tasks[index]
    meta, text = task.meta, task.messages[0]["content"]
    if not with_reference:
        return [{"role": "user", "content": text}], sloppy_answer(meta["letter"], meta["count"], rng)
    other = rng.choice([i for i in range(len(tasks)) if i != index])
    trace = observation_lite_trace([(tasks.reference_solution(other), "")], 10**6, 10**6)
    reference = composer_input_text_of(tasks[other].messages[0]["content"], trace)
    content = framing[0] + reference + framing[1] + text
    return [{"role": "user", "content": content}], tasks.reference_solution(index)


def build_letters_warm_model(out_dir: str, arch: str = "qwen3", steps: int = WARM_START_STEPS, seed: int = 0) -> str:
    """Builds the random tiny model, runs `steps` SFT steps (loss on answer tokens only) and writes it atomically."""
    from lopd_ray.config import ComposerConfig, EnvConfig
    from lopd_ray.envs.letters import LettersTasks
    from lopd_ray.models.tiny import build_tiny_model

    letters, composer = EnvConfig().letters, ComposerConfig()
    tasks = LettersTasks(letters.alphabet, letters.min_count, letters.max_count, letters.num_tasks, "train")
    with atomic_directory(out_dir) as model_dir:
        _warm_start(build_tiny_model(model_dir, arch=arch, seed=seed), tasks, composer, steps, seed)
    return out_dir


def _warm_start(model_dir: str, tasks, composer, steps: int, seed: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START_LR)
    model.train()
    for _ in range(steps):
        rows = []
        for _ in range(WARM_START_BATCH):
            messages, answer = warm_start_example(tasks, rng.randrange(len(tasks)), rng.random() < 0.5, rng,
                                                  (composer.framing_before, composer.framing_after))
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            rows.append((tokenizer(prompt)["input_ids"], tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]))
        width = max(len(p) + len(a) for p, a in rows)
        input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, (prompt, answer) in enumerate(rows):
            n = len(prompt) + len(answer)
            input_ids[row, :n] = torch.tensor(prompt + answer)
            labels[row, len(prompt):n] = torch.tensor(answer)
            attention_mask[row, :n] = 1
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(model_dir)


def fingerprint_constants() -> dict:
    """What builtin:tiny-qwen3-letters' fingerprint takes besides the builder's parameters (WARM_START_STEPS is the
    default of its `steps`, so it is among them)."""
    from lopd_ray.config import ComposerConfig, EnvConfig
    from lopd_ray.models import tiny

    env, composer = EnvConfig(), ComposerConfig()
    return {**tiny.fingerprint_constants(), "WARM_START_BATCH": WARM_START_BATCH, "WARM_START_LR": WARM_START_LR,
            "STRAY_LETTERS": STRAY_LETTERS,
            "letters": [env.letters.alphabet, env.letters.min_count, env.letters.max_count, env.letters.num_tasks],
            "framing": [composer.framing_before, composer.framing_after]}
