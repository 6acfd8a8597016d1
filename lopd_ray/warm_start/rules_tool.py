"""`builtin:tiny-qwen3-rules-tool`: `builtin:tiny-qwen3-rules` warm-started further on the multi-turn `rules_tool`
task (lopd_ray/envs/rules_tool.py), the base model of its study.

Every example is a two-turn episode under a fresh codename and tag, as in warm_start/rules.py: the call (the tag
guessed alone or under an empty framing, the reference's tag after a solved example in any method's framing, also
under a mismatched codename), the tool's reply for the tag called, then the reply's code as the answer. The
reference is shown in the shapes the teachers see: the call alone (a seeded reference, OPSD's solution), the call
and the answer (a sibling's response), or the bank's trace of a rollout (call, observation, answer). The code is
never in the reference (it depends on the task's input), so the model learns to take the procedure from its context
and the value from the tool.

Starting from the rules model, TOOL_WARM_STEPS steps take about 5 minutes on one core; the weights are committed
(lopd_ray/models/assets/tiny_qwen3_rules_tool/) and `python -m lopd_ray.warm_start.rules_tool` trains them again.
"""
from __future__ import annotations

import random
import shutil

from lopd_ray.envs.rules import TAGS, answer_text, task_text
from lopd_ray.envs.rules_tool import OBSERVATION_ROLE, tool_code
from lopd_ray.models import RULES_MODEL_DIR as RULES_ASSET_DIR
from lopd_ray.models import RULES_TOOL_MODEL_DIR as ASSET_DIR
from lopd_ray.warm_start.rules import (ALONE_SHARE, EMPTY_FRAMING_SHARE, MISMATCH_SHARE, codename,
                                       copy_committed_weights, letters, train_warm)

TOOL_WARM_STEPS = 400
TOOL_WARM_BATCH = 16
TOOL_WARM_LR = 5e-4
TOOL_WARM_UP_STEPS = 20
REFERENCE_SHAPES = ("call", "call_and_answer", "trace")


def reference_text(rng: random.Random, tag: str, shown_letters: str) -> tuple[str, str]:
    """(shape, the reference's solution text) of a solved task with `tag` on `shown_letters`."""
    from lopd_ray.bank.traces import observation_lite_trace

    call, code = answer_text(tag, shown_letters), tool_code(tag, shown_letters)
    shape = rng.choice(REFERENCE_SHAPES)
    if shape == "call":
        return shape, call
    if shape == "call_and_answer":
        return shape, f"{call}\n{code}"
    return shape, observation_lite_trace([(call, f"Result: {code}"), (code, "")], 10_000, 10_000)


def tool_episode(rng: random.Random, cfg) -> tuple[list[dict], list[tuple[str, list[dict]]]]:
    """(opening messages with the context placed, [(agent message, the env's reply)]) of one warm-start episode."""
    from lopd_ray.bank.traces import composer_input_text_of
    from lopd_ray.teacher.framings import FRAMINGS
    from lopd_ray.teacher.injection import place_context

    name, own = codename(rng), letters(rng)
    messages = [{"role": "user", "content": task_text(name, own)}]
    draw = rng.random()
    tag = rng.choice(TAGS)
    if draw >= ALONE_SHARE:
        framing_name = rng.choice(sorted(FRAMINGS))
        framing = FRAMINGS[framing_name]
        if draw < ALONE_SHARE + EMPTY_FRAMING_SHARE:
            messages = place_context(messages, framing(cfg, "", ""))
        else:
            shown = codename(rng) if rng.random() < MISMATCH_SHARE else name
            problem = task_text(shown, letters(rng))
            shape, solution = reference_text(rng, tag, letters(rng))
            context = framing(cfg, problem, solution)
            if framing_name == "lopd_text" and shape == "trace":  # the bank's entry of a rollout, written out
                c = cfg.composer
                context.text = c.framing_before + composer_input_text_of(problem, solution) + c.framing_after
            messages = place_context(messages, context)
    call = answer_text(tag, own)
    code = tool_code(tag, own)
    return messages, [(call, [{"role": OBSERVATION_ROLE, "content": f"Result: {code}"}]), (code, [])]


def supervised_episode(tokenizer, messages: list[dict], turns: list[tuple[str, list[dict]]]):
    """(token ids, labels) of a multi-turn episode rendered as the rollout renders it: labels on the agent's
    messages and their end-of-turn tokens, -100 on the prompt and the env's replies."""
    from lopd_ray.rollout.agent_loop import observation_ids, render_ids

    ids = render_ids(tokenizer, messages, add_generation_prompt=True)
    labels = [-100] * len(ids)
    messages = list(messages)
    for action, reply in turns:
        target = tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids, labels = ids + target, labels + target
        messages.append({"role": "assistant", "content": action})
        if reply:
            obs = observation_ids(tokenizer, messages, reply, target)
            ids, labels = ids + obs, labels + [-100] * len(obs)
            messages += reply
    return ids, labels


def warm_recipe() -> dict:
    """The rules model's fingerprint (it starts from that model) and this one's (lopd_ray.warm_start.rules)."""
    from lopd_ray.config import Config
    from lopd_ray.warm_start import rules as rules_warm

    cfg = Config()
    return rules_warm.fingerprint(lambda tokenizer, rng: supervised_episode(tokenizer, *tool_episode(rng, cfg)),
                                  "rules_tool", [rules_warm.warm_recipe()["sha256"], TOOL_WARM_STEPS, TOOL_WARM_BATCH,
                                                 TOOL_WARM_LR, TOOL_WARM_UP_STEPS])


def train_rules_tool_warm_model(out_dir: str, steps: int = TOOL_WARM_STEPS, seed: int = 0) -> str:
    from lopd_ray.config import Config

    cfg = Config()
    return train_warm(out_dir, lambda model_dir: shutil.copytree(RULES_ASSET_DIR, model_dir, dirs_exist_ok=True),
                      lambda tokenizer, rng: supervised_episode(tokenizer, *tool_episode(rng, cfg)), steps,
                      TOOL_WARM_BATCH, TOOL_WARM_LR, seed, TOOL_WARM_UP_STEPS, warm_recipe())


def build_rules_tool_warm_model(out_dir: str) -> str:
    """The builtin: a copy of the committed weights."""
    return copy_committed_weights(ASSET_DIR, out_dir)


if __name__ == "__main__":
    shutil.rmtree(ASSET_DIR, ignore_errors=True)
    train_rules_tool_warm_model(ASSET_DIR)
    print(f"wrote {ASSET_DIR}")
