"""The warm start of `builtin:tiny-qwen3-envscaler`: what the model sees alone and with a reference, and that only
the assistant turns are learned."""
from __future__ import annotations

from transformers import AutoTokenizer

from lopd_ray.config import ComposerConfig
from lopd_ray.warm_start.envscaler import (CLOSING, TOKENIZER_DIR, demonstration, kind_of, known_kinds,
                                           reference_pairs, supervised_sequence, train_tasks, warm_examples)


def test_alone_the_model_sees_only_known_kinds_and_every_reference_is_another_scenario_of_the_same_kind():
    tasks = train_tasks()
    known = known_kinds()
    kinds = [kind_of(tasks[i].meta["scenario"]) for i in range(len(tasks))]
    alone, referenced = warm_examples(tasks)
    assert len(alone) == sum(k in known for k in kinds) and 0 < len(alone) < len(tasks)
    assert all(m[1]["content"] in {tasks[i].messages[1]["content"] for i in range(len(tasks)) if kinds[i] in known}
               for m in alone)
    pairs = reference_pairs(tasks)
    assert len(pairs) == len(referenced) == len(tasks)
    assert all(i != j and kinds[i] == kinds[j] for i, j in pairs)
    for (i, j), messages in zip(pairs, referenced):
        user = messages[1]["content"]
        assert user.startswith(ComposerConfig().framing_before) and user.endswith(tasks[i].messages[1]["content"])
        assert f"Task to solve:\n{tasks[j].messages[1]['content']}\n" in user
    # Every domain has kinds the student knows alone, and some kinds it does not.
    assert {d for d, _ in known} == {d for d, _ in kinds} and len(known) < len(set(kinds))


def test_only_the_assistant_turns_and_their_end_of_turn_tokens_are_labelled():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    messages = demonstration(train_tasks(), 0)
    ids, labels = supervised_sequence(tokenizer, messages)
    assert len(ids) == len(labels)
    learned = tokenizer.decode([t for t in labels if t != -100])
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    assert learned == "<|im_end|>".join(turns) + "<|im_end|>" and turns[-1] == CLOSING
    assert all(label in (-100, token) for token, label in zip(ids, labels))
