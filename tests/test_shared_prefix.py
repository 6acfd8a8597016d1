"""The shared-prefix forward (lopd_ray/modeling/shared_prefix.py): the same hidden states and the same gradients as
the plain forward of the padded batch, whatever the groups and tails look like."""
from __future__ import annotations

import pytest
import torch

from lopd_ray.modeling.shared_prefix import decode, layout, shared_micro_batches

# (group, middle length, tail length) per row; rows of a group share their middle. A zero tail: a prompt alone.
ROWS = [(0, 3, 4), (0, 3, 2), (1, 6, 5), (2, 1, 0), (2, 1, 3), (2, 1, 1)]
PREFIX = 5


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def batch(model):
    """Right-padded embeddings built from leaves (a common prefix, one middle per group, one tail per row), so that
    a gradient reaches each leaf however many rows read it."""
    d = model.config.hidden_size
    torch.manual_seed(1)
    prefix = torch.randn(PREFIX, d, requires_grad=True)
    middles = {g: torch.randn(m, d, requires_grad=True) for g, m, _ in ROWS}
    tails = [torch.randn(t, d, requires_grad=True) for _, _, t in ROWS]
    rows = [torch.cat([prefix, middles[g], tail]) for (g, _, _), tail in zip(ROWS, tails)]
    embeds = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    lengths = [len(r) for r in rows]
    return embeds, lengths, [prefix, *middles.values(), *tails]


def grads(model, embeds, lengths, leaves, hidden):
    mask = torch.zeros(hidden.shape[:2])
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    torch.manual_seed(2)
    loss = (hidden * torch.randn_like(hidden) * mask[..., None]).sum()
    weight = model.model.layers[0].self_attn.q_proj.weight
    return torch.autograd.grad(loss, [*leaves, weight], retain_graph=True)


def test_the_tree_forward_equals_the_plain_forward_and_its_gradients(model):
    decoder = model.get_decoder()
    embeds, lengths, leaves = batch(model)
    mask = (torch.arange(embeds.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    plain = decoder(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    ids = torch.zeros(embeds.shape[:2], dtype=torch.long)  # the ids say nothing here: the prefix is given below
    shared = layout(ids, lengths, [PREFIX + m for _, m, _ in ROWS], [g for g, _, _ in ROWS], PREFIX)
    assert shared.prefix == PREFIX and shared.group == [0, 0, 1, 2, 2, 2] and shared.saves_work()
    tree = decode(decoder, embeds, shared)
    assert tree.shape == plain.shape
    for row, n in enumerate(lengths):
        torch.testing.assert_close(tree[row, :n], plain[row, :n], atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(model, embeds, lengths, leaves, tree), grads(model, embeds, lengths, leaves, plain)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_one_prompt_for_every_row_still_equals_the_plain_forward(model):
    decoder = model.get_decoder()
    torch.manual_seed(3)
    prompt = torch.randn(6, model.config.hidden_size)
    tails = [torch.randn(n, model.config.hidden_size) for n in (3, 1, 4)]
    rows = [torch.cat([prompt, tail]) for tail in tails]
    embeds, lengths = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), [len(r) for r in rows]
    mask = (torch.arange(embeds.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    plain = decoder(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    shared = layout(torch.zeros(embeds.shape[:2], dtype=torch.long), lengths, [6, 6, 6], ["p"] * 3, 99)
    assert shared.prefix == 5 and shared.group == [0, 0, 0]
    tree = decode(decoder, embeds, shared)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(tree[row, :n], plain[row, :n], atol=1e-5, rtol=1e-5)


def test_the_layout_shares_the_longest_common_run_of_ids_up_to_the_limit_and_the_splits():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5, 6], [1, 2, 3, 4, 5, 0]])
    assert layout(ids, [6, 6, 5], [5, 5, 5], ["a", "b", "a"], 99).prefix == 3
    assert layout(ids, [6, 6, 5], [5, 5, 5], ["a", "b", "a"], 2).prefix == 2  # latents from position 2 on
    assert layout(ids[[0, 2]], [6, 5], [3, 5], ["a", "b"], 99).prefix == 2  # row 0's group keeps position 2
    assert layout(ids[[0, 0]], [6, 6], [4, 4], ["a", "a"], 99).prefix == 3  # one prompt: one position of its own
    alone = layout(ids[:1], [6], [5], ["a"], 99)
    assert alone.prefix == 0 and not alone.saves_work()
    assert layout(ids, [6, 6, 5], [5, 5, 5], ["x", "y", "x"], 0).group == [0, 1, 0]


def test_micro_batches_count_each_shared_prompt_once():
    # prompts of 10 tokens shared in pairs, responses of 3: two pairs cost 2 x 10 + 4 x 3 = 32
    keys = ["a", "a", "b", "b", "c"]
    assert shared_micro_batches([10] * 5, [3] * 5, keys, 32) == [[0, 1, 2, 3], [4]]
    assert shared_micro_batches([10] * 5, [3] * 5, keys, 31) == [[0, 1, 2], [3, 4]]
    # padded: the longest prompt and the longest response count for every member (2 x 40 + 3 x 3 = 89)
    assert shared_micro_batches([10, 10, 40], [3, 3, 1], ["a", "a", "b"], 89) == [[0, 1, 2]]
    assert shared_micro_batches([10, 10, 40], [3, 3, 1], ["a", "a", "b"], 88) == [[0, 1], [2]]
    assert shared_micro_batches([50], [50], ["a"], 10) == [[0]]  # alone, however large
