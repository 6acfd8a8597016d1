"""The composer (LoRA encoder + Perceiver resampler) and latent injection into the teacher, on the tiny model."""
from __future__ import annotations

import pytest
import torch

from lopd_ray.config import ComposerConfig
from lopd_ray.data.trajectory import TeacherContext
from lopd_ray.modeling.logprobs import token_logprobs
from lopd_ray.rollout.agent_loop import render_ids
from lopd_ray.teacher.composer import Composer, PerceiverResampler
from lopd_ray.teacher.injection import (LATENT_SLOT, embed_with_latents, response_positions, teacher_prompt_ids,
                                        teacher_sequence)

CFG = ComposerConfig(num_queries=3, depth=2)
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Reply with the letter 'a' repeated 5 times."}]
OTHER_MESSAGES = [{"role": "user", "content": "Write the number 12 then stop."}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def load_backbone(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _composer(load_backbone, seed: int = 0, randomize_lora: bool = True) -> Composer:
    torch.manual_seed(seed)
    composer = Composer(load_backbone(), CFG)
    if randomize_lora:  # lora_B starts at zero, which would make the adapter a no-op
        with torch.no_grad():
            for name, param in composer.named_phi_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.2)
    return composer


def _entries(tokenizer) -> list[list[int]]:
    texts = ["Task to solve:\nReply with b\n\nReference past trajectory:\nbbbb", "Task: say 7\n\nTrajectory:\n7",
             "Reply with the letter 'c' repeated 3 times.\nccc"]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(map(len, rows))
    ids_BT = torch.tensor([r + [pad_id] * (T - len(r)) for r in rows])
    mask_BT = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    return ids_BT, mask_BT


def _teacher_prompt(tokenizer, messages, num_latents, framing=(CFG.framing_before, CFG.framing_after)):
    context = TeacherContext(framing[0] + LATENT_SLOT + framing[1], "user_prefix")
    return teacher_prompt_ids(tokenizer, messages, context, num_latents, placeholder_id=tokenizer.pad_token_id)


# --- injection -------------------------------------------------------------------------------------------------

def test_latents_equal_to_token_embeddings_give_the_logits_of_those_tokens(tokenizer, load_backbone):
    model = load_backbone()
    prompts = [_teacher_prompt(tokenizer, MESSAGES, 6), _teacher_prompt(tokenizer, OTHER_MESSAGES, 3)]
    known = [[300, 301, 302, 303, 304, 305], [400, 401, 402]]
    ids_BT, mask_BT = _right_pad([ids for ids, _ in prompts], tokenizer.pad_token_id)
    latents = [model.get_input_embeddings().weight[k].detach() for k in known]
    embeds_BTd = embed_with_latents(model, ids_BT, [s for _, s in prompts], latents)
    token_ids_BT = ids_BT.clone()
    for b, (_, span) in enumerate(prompts):
        token_ids_BT[b, span] = torch.tensor(known[b])
    with torch.no_grad():
        injected = model(inputs_embeds=embeds_BTd, attention_mask=mask_BT).logits
        as_tokens = model(input_ids=token_ids_BT, attention_mask=mask_BT).logits
        placeholders = model(input_ids=ids_BT, attention_mask=mask_BT).logits
    real = mask_BT.bool()
    torch.testing.assert_close(injected[real], as_tokens[real], atol=1e-5, rtol=0)
    assert not torch.allclose(injected[real], placeholders[real], atol=1e-3)  # the latents did replace something


def test_latent_count_must_match_its_slice(tokenizer, load_backbone):
    model = load_backbone()
    ids, span = _teacher_prompt(tokenizer, MESSAGES, 6)
    with pytest.raises(ValueError, match="6 positions but 5 latents"):
        embed_with_latents(model, torch.tensor([ids]), [span], [torch.zeros(5, model.config.hidden_size)])


# --- gradients and where the LoRA is active ----------------------------------------------------------------------

def test_teacher_loss_trains_phi_and_never_the_backbone(tokenizer, load_backbone):
    composer = _composer(load_backbone)
    latents = composer.latents([_entries(tokenizer)[:2], _entries(tokenizer)[2:]])
    assert [tuple(t.shape) for t in latents] == [(2 * CFG.num_queries, 64), (CFG.num_queries, 64)]
    prompts = [_teacher_prompt(tokenizer, MESSAGES, 6), _teacher_prompt(tokenizer, OTHER_MESSAGES, 3)]
    ids_BT, mask_BT = _right_pad([ids for ids, _ in prompts], tokenizer.pad_token_id)
    with composer.teacher_model() as teacher:
        embeds_BTd = embed_with_latents(teacher, ids_BT, [s for _, s in prompts], latents)
        logits = teacher(inputs_embeds=embeds_BTd, attention_mask=mask_BT).logits
    logits[mask_BT.bool()].log_softmax(-1)[:, 7].sum().backward()
    phi = dict(composer.named_phi_parameters())
    assert any("lora_A" in n for n in phi) and any("lora_B" in n for n in phi)
    for name, param in phi.items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    phi_ids = {id(p) for p in phi.values()}
    base = [(n, p) for n, p in composer.named_parameters() if id(p) not in phi_ids]
    assert base and all(p.grad is None and not p.requires_grad for _, p in base)


def test_lora_is_on_while_encoding_and_off_in_the_teacher_forward(tokenizer, load_backbone):
    composer = _composer(load_backbone, randomize_lora=False)
    entries = _entries(tokenizer)
    ids_BT = torch.tensor([render_ids(tokenizer, MESSAGES, add_generation_prompt=True)])

    def teacher_logits() -> torch.Tensor:
        with composer.teacher_model() as teacher:
            return teacher(input_ids=ids_BT).logits

    with torch.no_grad():
        enc_before, teacher_before, adapted_before = composer.encode(entries), teacher_logits(), composer.lm(
            input_ids=ids_BT).logits
        for name, param in composer.named_phi_parameters():
            if "lora_B" in name:
                param.normal_(std=0.2)
        enc_after, teacher_after, adapted_after = composer.encode(entries), teacher_logits(), composer.lm(
            input_ids=ids_BT).logits
        enc_again = composer.encode(entries)
    assert not torch.allclose(enc_before, enc_after, atol=1e-4)
    assert torch.equal(teacher_before, teacher_after)
    assert not torch.allclose(adapted_before, adapted_after, atol=1e-4)  # the perturbation is visible when on
    assert torch.equal(enc_again, enc_after)  # leaving teacher_model() turned the adapter back on


# --- student / teacher alignment -------------------------------------------------------------------------------

def test_empty_context_teacher_prompt_is_the_student_prompt_and_scores_match(tokenizer, load_backbone):
    student_ids = render_ids(tokenizer, MESSAGES, add_generation_prompt=True)
    ids, span = _teacher_prompt(tokenizer, MESSAGES, 0, framing=("", ""))
    assert ids == student_ids and span.start == span.stop

    model = load_backbone()
    response = tokenizer("aaaaa", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    seq = torch.tensor([teacher_sequence(ids, response)])
    with torch.no_grad():
        student_lp = token_logprobs(model, seq, torch.ones_like(seq), chunk_tokens=8)[0]
        embeds = embed_with_latents(model, seq, [span], [torch.zeros(0, model.config.hidden_size)])
        teacher_lp_Tv = model(inputs_embeds=embeds).logits[0].log_softmax(-1)
    pos = response_positions(len(ids), len(response))
    teacher_lp = teacher_lp_Tv[pos, torch.tensor(response)]
    torch.testing.assert_close(teacher_lp, student_lp[len(student_ids) - 1:], atol=1e-5, rtol=0)


def test_latent_block_shifts_the_prompt_and_response_positions_by_exactly_JK(tokenizer):
    J, K = 2, 3
    response = tokenizer("aaaaa", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    plain_ids, plain_span = _teacher_prompt(tokenizer, MESSAGES, 0)
    ids, span = _teacher_prompt(tokenizer, MESSAGES, J * K)
    assert len(ids) == len(plain_ids) + J * K
    assert span == slice(plain_span.start, plain_span.start + J * K)
    assert ids[span] == [tokenizer.pad_token_id] * (J * K)
    assert ids[:span.start] + ids[span.stop:] == plain_ids
    assert tokenizer.pad_token_id not in plain_ids  # so the placeholders are exactly the slice
    plain_pos, pos = response_positions(len(plain_ids), len(response)), response_positions(len(ids), len(response))
    assert torch.equal(pos - plain_pos, torch.full_like(pos, J * K))
    for prompt, positions in ((plain_ids, plain_pos), (ids, pos)):
        seq = teacher_sequence(prompt, response)
        assert [seq[p + 1] for p in positions.tolist()] == response  # position p scores token p+1


def test_framing_sits_before_the_task_text_in_the_first_user_message(tokenizer):
    ids, span = _teacher_prompt(tokenizer, MESSAGES, 4)
    before, after = tokenizer.decode(ids[:span.start]), tokenizer.decode(ids[span.stop:])
    assert before.endswith("<|im_start|>user\n" + CFG.framing_before)
    assert after.startswith(CFG.framing_after + MESSAGES[1]["content"] + "<|im_end|>")
    assert "You are a helpful assistant." in before  # the system message is untouched, before the block


# --- the resampler ---------------------------------------------------------------------------------------------

def test_resampler_shape_and_padding_invariance():
    torch.manual_seed(0)
    d, K = 64, 5
    resampler = PerceiverResampler(d, num_queries=K, num_heads=2, depth=3)
    H = torch.randn(1, 7, d)
    alone = resampler(H, torch.ones(1, 7))
    assert alone.shape == (1, K, d)
    padded_H = torch.cat([H, 100 * torch.randn(1, 4, d)], dim=1).repeat(2, 1, 1)
    mask = torch.tensor([[1] * 7 + [0] * 4, [1] * 11])
    out = resampler(padded_H, mask)
    assert out.shape == (2, K, d)
    torch.testing.assert_close(out[0], alone[0], atol=1e-5, rtol=0)
    assert not torch.allclose(out[1], alone[0], atol=1e-3)  # the garbage would matter if it were not masked


def test_encode_is_invariant_to_batch_padding(tokenizer, load_backbone):
    composer = _composer(load_backbone)
    short, long = _entries(tokenizer)[1], _entries(tokenizer)[0]
    assert len(short) < len(long)
    with torch.no_grad():
        torch.testing.assert_close(composer.encode([short, long])[0], composer.encode([short])[0], atol=1e-5, rtol=0)
        assert composer.encode([]).shape == (0, CFG.num_queries, 64)
        assert [tuple(t.shape) for t in composer.latents([[], [short]])] == [(0, 64), (CFG.num_queries, 64)]


def test_resampler_block_is_shared_across_depth():
    torch.manual_seed(0)
    shallow, deep = (PerceiverResampler(64, num_queries=4, num_heads=2, depth=k) for k in (1, 8))
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(shallow) == count(deep)
    shallow.load_state_dict(deep.state_dict())  # same parameters, strictly
    H, mask = torch.randn(2, 6, 64), torch.ones(2, 6)
    assert not torch.allclose(shallow(H, mask), deep(H, mask), atol=1e-4)  # depth applies the block again


# --- checkpoints -----------------------------------------------------------------------------------------------

def test_phi_state_dict_round_trip_restores_latents_exactly(tokenizer, load_backbone):
    source, target = _composer(load_backbone, seed=0), _composer(load_backbone, seed=1)
    entries = _entries(tokenizer)
    state = source.phi_state_dict()
    n_lora = 2 * len(CFG.lora_targets) * source.lm.config.num_hidden_layers  # A and B per target per layer
    assert sum(k.startswith("lora.") for k in state) == n_lora
    assert len(state) == n_lora + len(list(source.resampler.parameters()))
    with torch.no_grad():
        expected = source.encode(entries)
        assert not torch.allclose(target.encode(entries), expected, atol=1e-4)
        target.load_phi_state_dict(state)
        assert torch.equal(target.encode(entries), expected)
    with pytest.raises(KeyError, match="missing"):
        target.load_phi_state_dict({k: v for k, v in state.items() if "resampler" not in k})


def test_output_scale_starts_the_latents_at_the_token_embeddings_rms_or_at_one(tokenizer, load_backbone):
    from dataclasses import replace

    backbone = load_backbone()
    token_rms = float(backbone.get_input_embeddings().weight.pow(2).mean().sqrt())
    assert token_rms < 0.2  # the tiny model's embeddings are far below 1, so the two starts differ
    rms = {}
    for scale in ("unit", "token_embeddings"):
        torch.manual_seed(0)
        composer = Composer(load_backbone(), replace(CFG, output_scale=scale))
        with torch.no_grad():
            rms[scale] = float(composer.encode(_entries(tokenizer)).pow(2).mean().sqrt())
    assert rms["unit"] == pytest.approx(1.0, rel=0.01)  # a LayerNorm's output, gain 1 and bias 0
    assert rms["token_embeddings"] == pytest.approx(token_rms, rel=0.01)
