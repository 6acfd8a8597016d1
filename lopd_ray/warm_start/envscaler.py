"""`builtin:tiny-qwen3-envscaler`: a small Qwen3 warm-started on the generated EnvScaler-format suite as an agent of
partial competence that experience helps, the base model of the tool-use study.

RL and self-distillation only show something from a policy that solves some tasks and fails others, and LOPD only
from one whose context can make it better. A random model solves nothing; SmolLM2-135M is too slow for a study grid
on a 2-core CPU. So the model is the tiny Qwen3's size (230k parameters) with a BPE tokenizer trained on the suite's
own text and the tools listed as signatures (env.envscaler.tool_listing=signatures), so that an episode is some 600
tokens, and it learns by supervised fine-tuning on oracle demonstrations (one tool call per assistant turn, the
tool's JSON result, a closing "Done."), in two kinds of example, half each:
- the task alone, for the scenarios of the task kinds it "knows" (KNOWN_KIND_SHARE of each domain's kinds);
- the task after a reference example of ANOTHER train scenario of the same kind (framed as LOPD's teacher frames its
  latent block, the trace written as the bank writes a seeded reference), for every kind.
So the student alone solves (in part) the kinds it knows; with a retrieved experience of the same kind it can solve
the others too: the regime where a teacher with experience knows more than the student, and where GRPO has to find
the other kinds' tool sequences by itself. Deterministic (fixed seeds); the generated suite only (never a released
EnvScaler JSON found under env.data_dir).

`python -m lopd_ray.warm_start.envscaler` retrains the committed tokenizer (only needed to change it).
"""
from __future__ import annotations

import json
import random

from lopd_ray.models import ENVSCALER_TOKENIZER_DIR as TOKENIZER_DIR
from lopd_ray.utils.atomic import atomic_directory

TOKENIZER_VOCAB = 2048
SIZES = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32)
TOOL_LISTING = "signatures"      # the model's runs set env.envscaler.tool_listing to it
KNOWN_KIND_SHARE = 0.5
WARM_STEPS = 1200
WARM_BATCH = 8
WARM_LR = 3e-3
CLOSING = "Done."


def train_tasks():
    from lopd_ray.envs.envscaler.env import EnvScalerTasks, split_scenarios
    from lopd_ray.envs.envscaler.suite import build_suite

    catalog = build_suite()
    return EnvScalerTasks(catalog, split_scenarios(catalog, "train"), TOOL_LISTING)


def kind_of(scenario) -> tuple[str, int]:
    """(domain, kind index) of a generated scenario: scenario i of a domain is of kind i mod the domain's kinds."""
    from lopd_ray.envs.envscaler.suite import domains

    return scenario.env_name, int(scenario.scenario_id.rsplit("-", 1)[1]) % len(domains()[scenario.env_name].kinds)


def known_kinds(seed: int = 0) -> set[tuple[str, int]]:
    """The kinds the student learns without a reference: KNOWN_KIND_SHARE of each domain's, chosen by a seed."""
    from lopd_ray.envs.envscaler.suite import domains

    known = set()
    for name, domain in domains().items():
        kinds = list(range(len(domain.kinds)))
        random.Random(f"envscaler-warm/{name}/{seed}").shuffle(kinds)
        known.update((name, k) for k in kinds[:max(1, round(len(kinds) * KNOWN_KIND_SHARE))])
    return known


def demonstration(tasks, index: int) -> list[dict]:
    """The oracle's episode as chat messages: one call per assistant turn, each followed by its JSON result."""
    from lopd_ray.envs.envscaler.core import run_oracle
    from lopd_ray.envs.envscaler.env import OBSERVATION_ROLE, format_call

    task = tasks[index]
    calls, results, _ = run_oracle(task.meta["spec"], task.meta["scenario"])
    messages = list(task.messages)
    for call, result in zip(calls, results):
        messages.append({"role": "assistant", "content": format_call(call["name"], call["arguments"])})
        messages.append({"role": OBSERVATION_ROLE, "content": json.dumps(result)})
    return messages + [{"role": "assistant", "content": CLOSING}]


def with_reference(messages: list[dict], tasks, other: int) -> list[dict]:
    """`messages` with train scenario `other`'s reference solution in front of the task, as the bank stores a seeded
    reference and the teacher frames its context."""
    from lopd_ray.bank.traces import composer_input_text_of, observation_lite_trace
    from lopd_ray.config import BankConfig, ComposerConfig

    bank, composer = BankConfig(), ComposerConfig()
    trace = observation_lite_trace([(tasks.reference_solution(other), "")], bank.max_observation_chars,
                                   bank.max_trace_chars)
    reference = composer_input_text_of(tasks[other].user_text, trace)
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    framed = composer.framing_before + reference + composer.framing_after + messages[first_user]["content"]
    return [*messages[:first_user], {"role": "user", "content": framed}, *messages[first_user + 1:]]


def supervised_sequence(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids, labels): the labels are the assistant turns' tokens, through their end-of-turn token, as the
    agent loop renders them; everything else is -100."""
    from lopd_ray.rollout.agent_loop import render_ids

    ids, labels = [], []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render_ids(tokenizer, messages[:k], add_generation_prompt=True)
        turn = tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        labels += [-100] * (len(prompt) - len(ids)) + turn
        ids = prompt + turn
    return ids, labels


def reference_pairs(tasks, seed: int = 0) -> list[tuple[int, int]]:
    """(scenario, the other scenario of its kind whose reference it is shown with), for every scenario that has
    another of its kind."""
    kinds = [kind_of(tasks[i].meta["scenario"]) for i in range(len(tasks))]
    rng = random.Random(f"envscaler-warm/{seed}")
    pairs = []
    for i in range(len(tasks)):
        others = [j for j in range(len(tasks)) if j != i and kinds[j] == kinds[i]]
        if others:
            pairs.append((i, rng.choice(others)))
    return pairs


def warm_examples(tasks, seed: int = 0) -> tuple[list[list[dict]], list[list[dict]]]:
    """(examples alone: the scenarios of known kinds; examples with a reference), as chat messages."""
    known = known_kinds(seed)
    alone = [demonstration(tasks, i) for i in range(len(tasks)) if kind_of(tasks[i].meta["scenario"]) in known]
    return alone, [with_reference(demonstration(tasks, i), tasks, j) for i, j in reference_pairs(tasks, seed)]


def corpus() -> list[str]:
    """The text of the warm examples (system prompts, tasks, references, demonstrations), for the tokenizer."""
    alone, referenced = warm_examples(train_tasks())
    return [m["content"] for messages in alone + referenced for m in messages]


def build_envscaler_warm_model(out_dir: str, steps: int = WARM_STEPS, seed: int = 0) -> str:
    """Builds the random model, runs `steps` SFT steps on the warm examples and writes it atomically."""
    from lopd_ray.models.tiny import write_random_model

    with atomic_directory(out_dir) as model_dir:
        write_random_model(model_dir, "qwen3", SIZES, TOKENIZER_DIR, seed)
        _fine_tune(model_dir, steps, seed)
    return out_dir


def _fine_tune(model_dir: str, steps: int, seed: int) -> None:
    from transformers import AutoTokenizer

    from lopd_ray.warm_start.sft import fine_tune

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    groups = [[supervised_sequence(tokenizer, m) for m in group] for group in warm_examples(train_tasks(), seed)]
    fine_tune(model_dir, lambda rng, row: rng.choice(groups[row % 2]), steps, WARM_BATCH, WARM_LR, seed)


def fingerprint_constants() -> dict:
    """What builtin:tiny-qwen3-envscaler's fingerprint takes besides the builder's parameters."""
    from lopd_ray.config import BankConfig, ComposerConfig

    bank, composer = BankConfig(), ComposerConfig()
    return {"SIZES": SIZES, "KNOWN_KIND_SHARE": KNOWN_KIND_SHARE, "WARM_BATCH": WARM_BATCH, "WARM_LR": WARM_LR,
            "CLOSING": CLOSING, "trace": [bank.max_observation_chars, bank.max_trace_chars],
            "framing": [composer.framing_before, composer.framing_after]}


if __name__ == "__main__":
    from lopd_ray.models.tiny_tokenizer import train

    train(TOKENIZER_VOCAB, TOKENIZER_DIR, corpus())
    print(f"wrote {TOKENIZER_DIR}")

