"""Golden tests: a multi-turn sequence built incrementally (engine tokens kept, observation tokens from template
diffs) equals the full chat-template render of the same conversation, for the repo's tokenizers."""
from __future__ import annotations

import pytest

from lopd_ray.rollout.agent_loop import observation_ids, render_ids

CONVERSATION = [
    {"role": "user", "content": "Book a table for two at 7pm and tell me the confirmation code."},
    {"role": "assistant", "content": '<tool_call>{"name": "book", "arguments": {"people": 2, "time": "19:00"}}'
                                     '</tool_call>'},
    {"role": "tool", "content": '{"confirmation": "X7Q2", "status": "ok"}'},
    {"role": "assistant", "content": "Done. Your confirmation code is X7Q2."},
    {"role": "user", "content": "Thanks! Now cancel it."},
    {"role": "assistant", "content": '<tool_call>{"name": "cancel", "arguments": {"code": "X7Q2"}}</tool_call>'},
    {"role": "tool", "content": '{"status": "cancelled"}'},
]


def build_incrementally(tokenizer, truncate_turn: int | None = None) -> list[int]:
    """Replays CONVERSATION the way the agent loop does: prompt, generated turns (with the end-of-turn token the
    engine stops on, unless truncated), and observation tokens from `observation_ids`."""
    eos = tokenizer.eos_token_id
    messages = [CONVERSATION[0]]
    seq = render_ids(tokenizer, messages, add_generation_prompt=True)
    i = 1
    while i < len(CONVERSATION):
        turn = CONVERSATION[i]
        generated = tokenizer(turn["content"], add_special_tokens=False)["input_ids"]
        generated = generated if i == truncate_turn else generated + [eos]
        seq += generated
        messages.append(turn)
        observation = []
        i += 1
        while i < len(CONVERSATION) and CONVERSATION[i]["role"] != "assistant":
            observation.append(CONVERSATION[i])
            i += 1
        seq += observation_ids(tokenizer, messages, observation, generated)
        messages += observation
    return seq


@pytest.fixture
def tokenizer(chat_tokenizer):
    return chat_tokenizer


def test_incremental_tokens_equal_the_full_render(tokenizer):
    assert build_incrementally(tokenizer) == render_ids(tokenizer, CONVERSATION, add_generation_prompt=True)


def test_a_truncated_turn_is_closed_by_the_observation_tokens(tokenizer):
    # The engine stopped on the length limit: the template's end-of-turn token comes with the observation.
    assert build_incrementally(tokenizer, truncate_turn=1) == render_ids(tokenizer, CONVERSATION,
                                                                         add_generation_prompt=True)


def test_observation_tokens_exclude_the_generated_turn(tokenizer):
    messages = CONVERSATION[:2]
    generated = tokenizer(CONVERSATION[1]["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    obs = observation_ids(tokenizer, messages, [CONVERSATION[2]], generated)
    text = tokenizer.decode(obs)
    assert "X7Q2" in text and "book" not in text
    assert tokenizer.eos_token_id not in obs[:1]  # the generated turn already ended with it


def test_token_classes_follow_the_tool_call_syntax_of_the_message(tokenizer):
    from lopd_ray.envs.tool_parsers import json_tag_syntax, python_calls_syntax
    from lopd_ray.rollout.agent_loop import token_classes

    tok = tokenizer
    text = 'Listing.\n<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp", "n": 3}}\n</tool_call>'
    syntax = json_tag_syntax(text)
    content = "".join(c for c, s in zip(text, syntax) if not s)
    assert content == "Listing.\n/tmp3"  # the name, keys, quotes, braces and tags are syntax; values are content
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    classes = token_classes(tok, ids, text, syntax)
    pieces = [tok.decode([i]) for i in ids[:-1]]
    assert classes[-1] == -1 and set(classes[:-1]) == {0, 1}
    for piece, cls in zip(pieces, classes):
        if piece.strip() in ("{", "}", '"', ":", "<tool_call>", "</tool_call>", "name", "arguments"):
            assert cls == 1, (piece, cls)
        if piece.strip() in ("Listing", "tmp", "3"):
            assert cls == 0, (piece, cls)
    assert token_classes(tok, ids, text, None) == [-1] * len(ids)
    assert token_classes(tok, ids, text + "x", syntax + [False]) == [-1] * len(ids)  # does not map one to one
    calls = "Sure: [ls(path='/tmp', n=3), cd(folder=\"a\")]"
    assert "".join(c for c, s in zip(calls, python_calls_syntax(calls)) if not s) == "Sure: [/tmp3, a]"
