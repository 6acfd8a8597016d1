"""What a run puts into the bank before its first step, and what the composer's cold start learns from: the
reference solutions of the first `bank.seed_references` train tasks, where the env has them."""
from __future__ import annotations

from lopd_ray.bank.traces import BankEntry, ComposerInputs, observation_lite_trace


def seeded_task_indices(tasks, bank_cfg) -> list[int]:
    return [i for i in range(min(bank_cfg.seed_references, len(tasks))) if tasks.reference_solution(i) is not None]


def reference_entries(tasks, indices, bank_cfg) -> list[BankEntry]:
    """The reference solutions of tasks `indices` as the bank's single-action traces."""
    entries = []
    for index in indices:
        task = tasks[index]
        trace = observation_lite_trace([(tasks.reference_solution(index), "")], bank_cfg.max_observation_chars,
                                       bank_cfg.max_trace_chars)
        entries.append(BankEntry(f"{task.task_id}@reference", task.task_id, task.user_text, trace, 1.0, -1))
    return entries


def seed_bank(bank, tasks, bank_cfg) -> None:
    """Adds the reference solutions to the `bank` group as single-action traces."""
    bank.first("add", reference_entries(tasks, seeded_task_indices(tasks, bank_cfg), bank_cfg))


def cold_start_examples(bank, tasks, bank_cfg, inputs: ComposerInputs) -> list[dict]:
    """{"task_index", "answer", "retrieved_texts"} for the seeded tasks that have retrieved experience (their own
    only with bank.self_retrieval), the composer's cold-start data (METHOD 2.4); `inputs` writes the composer's input
    per entry."""
    indices = seeded_task_indices(tasks, bank_cfg)
    found = bank.first("retrieve", [tasks[i].user_text for i in indices], bank_cfg.top_j,
                       [tasks[i].task_id for i in indices])
    return [{"task_index": i, "answer": tasks.reference_solution(i),
             "retrieved_texts": inputs.texts(tasks[i].user_text, entries)}
            for i, entries in zip(indices, found) if entries]


def cold_start_plan(composer_cfg, examples: int) -> str:
    """What the cold start will do, for its progress line."""
    cc = composer_cfg
    phases = (f"{cc.cold_start_entry_steps} entry-latent and {cc.cold_start_regression_steps} regression steps, "
              f"then " if cc.cold_start_entry_steps else "")
    return f"composer cold start: {phases}{cc.cold_start_steps} steps on {examples} reference solutions"
