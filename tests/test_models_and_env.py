"""The tiny models, model paths, the `letters` env, the HF rollout engine, weights on the wire and chunked log-probs."""
from __future__ import annotations

import json
import os
import struct
import types

import pytest
import torch

from conftest import env_config
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.envs import ENVS, make_env
from lopd_ray.envs.letters import LettersTasks, letters_reward
from lopd_ray.modeling.logprobs import collate, response_values, token_logprobs
from lopd_ray.modeling.weights_io import deserialize, serialize, verify
from lopd_ray.models import resolve_model_path
from lopd_ray.models.tiny import build_tiny_model
from lopd_ray.rollout.engines.base import SamplingSpec
from lopd_ray.rollout.engines.hf_engine import HFEngine, filter_logits

torch.set_num_threads(1)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _state(path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _load(path).state_dict().items()}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return _load(tiny_model_dir)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """Same architecture, another seed: different weights."""
    return build_tiny_model(str(tmp_path_factory.mktemp("other") / "tiny-qwen3-seed1"), arch="qwen3", seed=1)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tokenizer):
    return HFEngine(tiny_model_dir, types.SimpleNamespace(gpus_per_worker=0), "float32", [tokenizer.eos_token_id])


def _prompt(tokenizer, text="Reply with the letter 'b' repeated 6 times.") -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def _full_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0,
                   top_k: int = -1, top_p: float = 1.0) -> list[float]:
    """Log-prob of each response token from one full-sequence forward (no KV cache)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[*prompt, *response]])).logits[0].float()
    out = []
    for j, tok in enumerate(response):
        row = filter_logits(logits[len(prompt) - 1 + j] / temperature, top_k, top_p)
        out.append(float(torch.log_softmax(row, -1)[tok]))
    return out


# ----------------------------------------------------------------------------------------------- tiny models

@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_tiny_model_loads_with_transformers(arch, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_dir if arch == "qwen3" else build_tiny_model(str(tmp_path / "tiny-llama"), arch="llama")
    m = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert m.config.model_type == arch
    assert m.config.tie_word_embeddings is True
    assert m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
    head_dim = getattr(m.config, "head_dim", None) or m.config.hidden_size // m.config.num_attention_heads
    assert head_dim >= 32
    assert m.config.vocab_size == len(tok)
    assert m.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 3, len(tok)) and torch.isfinite(logits).all()


def test_chat_template_is_chatml(tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say b."}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay b.<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    assert text.endswith("<|im_start|>assistant\n")
    no_gen = tokenizer.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert no_gen == text[:-len("<|im_start|>assistant\n")]
    ids = _prompt(tokenizer, "Say b.")
    # The ChatML markers are single special tokens.
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 2
    assert ids.count(tokenizer.eos_token_id) == 1


def test_build_is_deterministic_and_idempotent(tiny_model_dir, other_model_dir, tmp_path):
    out = str(tmp_path / "tiny")
    assert build_tiny_model(out, arch="qwen3", seed=0) == out
    first = _state(out)
    # Building again into the same path is a no-op that leaves no temp dirs behind.
    assert build_tiny_model(out, arch="qwen3", seed=0) == out
    assert [d for d in os.listdir(tmp_path) if d.startswith(".tmp_model_")] == []
    again = _state(out)
    # And the same seed in another place gives the very same weights.
    reference = _state(tiny_model_dir)
    assert first.keys() == again.keys() == reference.keys()
    for name in first:
        assert torch.equal(first[name], again[name]) and torch.equal(first[name], reference[name]), name
    other = _state(other_model_dir)
    assert not torch.equal(other["model.embed_tokens.weight"], first["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(str(tmp_path / "x"), arch="gpt2")


def test_resolve_model_path(tiny_model_dir, tmp_path, monkeypatch):
    assert resolve_model_path(tiny_model_dir) == tiny_model_dir
    not_hf = tmp_path / "not_hf"
    not_hf.mkdir()
    with pytest.raises(ValueError, match=r"model\.path"):
        resolve_model_path(str(not_hf))
    with pytest.raises(ValueError, match=r"model\.path"):
        resolve_model_path(str(tmp_path / "does_not_exist"))
    with pytest.raises(ValueError, match=r"model\.path"):
        resolve_model_path("builtin:no-such-model")

    cache = tmp_path / "cache"
    monkeypatch.setenv("LOPD_RAY_CACHE", str(cache))
    path = resolve_model_path("builtin:tiny-qwen3")
    assert os.path.commonpath([path, str(cache)]) == str(cache)
    assert os.path.isfile(os.path.join(path, "config.json"))
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["model_type"] == "qwen3"
    mtime = os.path.getmtime(os.path.join(path, "config.json"))
    assert resolve_model_path("builtin:tiny-qwen3") == path  # cached: not rebuilt
    assert os.path.getmtime(os.path.join(path, "config.json")) == mtime
    built, reference = _state(path), _state(tiny_model_dir)
    assert all(torch.equal(built[k], reference[k]) for k in reference)


# ----------------------------------------------------------------------------------------------- letters env

@pytest.mark.parametrize("text,letter,count,expected", [
    ("bbbbbb", "b", 6, 1.0),
    ("", "b", 6, 0.0),
    ("   \n", "b", 6, 0.0),
    ("bbb", "b", 6, 0.5),
    ("bbbbbbaa", "b", 6, 6 / 6 * 6 / 8),
    ("b b b\nb b b", "b", 6, 1.0),       # whitespace is not counted against purity
    ("aaaa", "b", 4, 0.0),
    ("bbbbbbbbbbbb", "b", 6, 1.0),       # coverage is capped at the asked count
    ("bbxx", "b", 4, 2 / 4 * 2 / 4),
])
def test_letters_reward(text, letter, count, expected):
    assert letters_reward(text, letter, count) == pytest.approx(expected)


def test_letters_tasks_deterministic_per_split():
    a = LettersTasks("ab", 4, 8, 64, "train")
    b = LettersTasks("ab", 4, 8, 64, "train")
    assert len(a) == 64
    assert [t.messages for t in a.tasks] == [t.messages for t in b.tasks]
    assert [t.meta for t in a.tasks] == [t.meta for t in b.tasks]
    assert len({t.task_id for t in a.tasks}) == 64 and a[3].task_id == "letters/train/3"
    assert {t.meta["letter"] for t in a.tasks} == {"a", "b"}
    assert {t.meta["count"] for t in a.tasks} <= set(range(4, 9))
    t = a[0]
    assert f"'{t.meta['letter']}'" in t.messages[0]["content"] and str(t.meta["count"]) in t.messages[0]["content"]


def test_letters_env_through_registry():
    assert "letters" in ENVS
    env_cls, tasks = make_env(env_config("letters", num_tasks=10, split="train"))
    assert len(tasks) == 10
    env = env_cls()
    task = tasks[0]
    env.reset(task)
    res = env.step(task.meta["letter"] * task.meta["count"])
    assert res.done and res.reward == pytest.approx(1.0)
    env.reset(task)
    assert env.step("zzz").reward == 0.0


# ----------------------------------------------------------------------------------------------- filter_logits

def test_filter_logits_top_k_keeps_exactly_k():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(100, generator=g)
    for k in (1, 5, 37):
        out = filter_logits(logits, k, 1.0)
        kept = torch.isfinite(out)
        assert int(kept.sum()) == k
        assert set(torch.nonzero(kept).flatten().tolist()) == set(torch.topk(logits, k).indices.tolist())
        assert torch.equal(out[kept], logits[kept])  # kept logits unchanged
    assert torch.equal(filter_logits(logits, -1, 1.0), logits)
    assert torch.equal(filter_logits(logits, 100, 1.0), logits)
    assert torch.equal(filter_logits(logits, 1000, 1.0), logits)


def test_filter_logits_filters_each_row_of_a_batch_as_it_would_alone():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    for top_k, top_p in ((-1, 0.8), (7, 1.0), (10, 0.5)):
        batched = filter_logits(logits, top_k, top_p)
        assert all(torch.equal(batched[i], filter_logits(logits[i], top_k, top_p)) for i in range(len(logits)))
        assert 0 < int(torch.isfinite(batched).sum()) < logits.numel()


@pytest.mark.parametrize("top_p,kept_probs", [
    (0.05, [0.4]),
    (0.39, [0.4]),
    (0.41, [0.4, 0.3]),
    (0.69, [0.4, 0.3]),
    (0.71, [0.4, 0.3, 0.2]),
    (0.95, [0.4, 0.3, 0.2, 0.1]),
])
def test_filter_logits_top_p_smallest_prefix(top_p, kept_probs):
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64)  # unsorted on purpose
    out = filter_logits(probs.log(), -1, top_p)
    kept = sorted(probs[torch.isfinite(out)].tolist(), reverse=True)
    assert kept == pytest.approx(kept_probs)
    assert sum(kept) >= top_p


def test_filter_logits_top_p_exact_boundary():
    probs = torch.tensor([0.125, 0.5, 0.125, 0.25], dtype=torch.float32)  # exactly representable
    out = filter_logits(probs.log(), -1, 0.5)
    assert torch.isfinite(out).tolist() == [False, True, False, False]


def test_filter_logits_top_k_then_top_p():
    probs = torch.tensor([0.35, 0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
    out = filter_logits(probs.log(), 3, 0.6)
    # After top-3 the renormalized masses are 0.41, 0.35, 0.24: top-p 0.6 keeps the first two.
    assert torch.isfinite(out).tolist() == [True, True, False, False, False]


# ----------------------------------------------------------------------------------------------- HF engine

def test_hf_engine_seeded_and_logprobs_match_full_forward(engine, model, tokenizer):
    prompts = [_prompt(tokenizer), _prompt(tokenizer, "Reply with the letter 'a' repeated 4 times.")]
    specs = [SamplingSpec(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=10, seed=s) for s in (11, 12)]
    first = engine.generate(prompts, specs)
    again = engine.generate(prompts, specs)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    other = engine.generate(prompts[:1], [SamplingSpec(1.0, 1.0, -1, 10, seed=99)])
    assert other[0].token_ids != first[0].token_ids
    for prompt, gen in zip(prompts, first):
        assert 1 <= len(gen.token_ids) <= 10 and len(gen.logprobs) == len(gen.token_ids)
        if gen.finish_reason == "length":
            assert len(gen.token_ids) == 10 and tokenizer.eos_token_id not in gen.token_ids
        else:
            assert gen.finish_reason == "stop" and gen.token_ids[-1] == tokenizer.eos_token_id
        expected = _full_logprobs(model, prompt, gen.token_ids)
        torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(expected), atol=1e-5, rtol=0)


def test_hf_engine_draws_the_same_tokens_for_a_prompt_alone_and_in_a_left_padded_batch(engine, tokenizer):
    short, long = _prompt(tokenizer, "Say b."), _prompt(tokenizer, "Reply with the letter 'q' repeated 7 times, please.")
    specs = [SamplingSpec(1.0, 1.0, -1, 12, seed=21), SamplingSpec(0.8, 0.9, 30, 6, seed=22)]
    together = engine.generate([short, long], specs)
    alone = [engine.generate([p], [s])[0] for p, s in zip((short, long), specs)]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert len(together[1].token_ids) <= 6  # each row stops at its own max_new_tokens
    for a, b in zip(together, alone):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_hf_engine_logprobs_are_of_the_processed_distribution(engine, model, tokenizer):
    prompt = _prompt(tokenizer)
    spec = SamplingSpec(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=8, seed=5)
    gen = engine.generate([prompt], [spec])[0]
    expected = _full_logprobs(model, prompt, gen.token_ids, temperature=0.7, top_k=20, top_p=0.9)
    assert all(lp > float("-inf") for lp in expected)  # every sampled token survived the filters
    torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(expected), atol=1e-5, rtol=0)
    # ... which differs from the raw temperature-1 distribution.
    raw = _full_logprobs(model, prompt, gen.token_ids)
    assert not torch.allclose(torch.tensor(gen.logprobs), torch.tensor(raw), atol=1e-3)


def test_hf_engine_load_weights(tiny_model_dir, other_model_dir, tokenizer, model):
    eng = HFEngine(tiny_model_dir, types.SimpleNamespace(gpus_per_worker=0), "float32", [tokenizer.eos_token_id])
    prompt = _prompt(tokenizer)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=8, seed=3)
    before = eng.generate([prompt], [spec])[0]
    new_model = _load(other_model_dir)
    payload, checksums = serialize(new_model.state_dict())
    assert verify(payload, checksums) == []
    eng.load_weights(payload)
    new_state = new_model.state_dict()
    for name, p in eng.model.state_dict().items():
        assert torch.equal(p, new_state[name]), name
    after = eng.generate([prompt], [spec])[0]
    torch.testing.assert_close(torch.tensor(after.logprobs),
                               torch.tensor(_full_logprobs(new_model, prompt, after.token_ids)), atol=1e-5, rtol=0)
    old_view = _full_logprobs(model, prompt, after.token_ids)
    assert not torch.allclose(torch.tensor(after.logprobs), torch.tensor(old_view), atol=1e-3)
    # (The sampled ids may coincide: both random models are near-uniform and the seed fixes the uniform draws.)
    assert not torch.allclose(torch.tensor(after.logprobs[:1]), torch.tensor(before.logprobs[:1]), atol=1e-4)


# ----------------------------------------------------------------------------------------------- weights_io

def _tensor_spans(payload: bytes) -> dict[str, tuple[int, int]]:
    """Absolute byte ranges of each tensor's data in a safetensors blob."""
    (header_len,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8:8 + header_len])
    base = 8 + header_len
    return {k: (base + v["data_offsets"][0], base + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"}


def test_weights_round_trip_and_tied_head(model):
    named = model.state_dict()
    payload, checksums = serialize(named)
    assert "lm_head.weight" in checksums and "model.embed_tokens.weight" in checksums
    assert set(checksums) == set(named)
    received = deserialize(payload)
    assert set(received) == set(named)
    for name, t in named.items():
        assert torch.equal(received[name], t) and received[name].dtype == t.dtype, name
    assert torch.equal(received["lm_head.weight"], received["model.embed_tokens.weight"])
    assert verify(payload, checksums) == []
    # The serialized tensors are copies: changing the model afterwards does not change the payload.
    with torch.no_grad():
        saved = model.model.norm.weight.clone()
        model.model.norm.weight.add_(1.0)
    try:
        assert verify(payload, checksums) == []
        assert torch.equal(deserialize(payload)["model.norm.weight"], saved)
    finally:
        with torch.no_grad():
            model.model.norm.weight.copy_(saved)


def test_verify_detects_corruption_and_missing(model):
    payload, checksums = serialize(model.state_dict())
    spans = _tensor_spans(payload)
    victim = "model.layers.1.mlp.down_proj.weight"
    start, end = spans[victim]
    corrupt = bytearray(payload)
    corrupt[(start + end) // 2] ^= 0x01  # one flipped bit in the middle of one tensor
    assert verify(bytes(corrupt), checksums) == [victim]

    from safetensors.torch import save

    partial = {k: v for k, v in deserialize(payload).items() if k != "model.norm.weight"}
    assert verify(save(partial), checksums) == ["model.norm.weight"]

    swapped = deserialize(payload)
    swapped["model.norm.weight"] = swapped["model.norm.weight"] * 1.5
    assert verify(save(swapped), checksums) == ["model.norm.weight"]


# ----------------------------------------------------------------------------------------------- log-probs

def _padded_batch(pad_id: int):
    seqs = [[5, 17, 300, 42, 8, 999, 3, 77, 12], [9, 1000, 4, 4, 250, 6]]
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
    return seqs, ids, attn


def _reference_logprobs(model, ids, attn):
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_token_logprobs_chunked_equals_full(model, tokenizer, chunk):
    seqs, ids, attn = _padded_batch(tokenizer.pad_token_id)
    with torch.no_grad():
        got = token_logprobs(model, ids, attn, chunk_tokens=chunk)
        ref = _reference_logprobs(model, ids, attn)
    assert got.shape == (2, ids.shape[1] - 1)
    valid = attn[:, 1:].bool()
    torch.testing.assert_close(got[valid], ref[valid], atol=1e-5, rtol=0)
    # And each row equals the unpadded forward of its own sequence.
    for i, s in enumerate(seqs):
        with torch.no_grad():
            alone = _reference_logprobs(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0]
        torch.testing.assert_close(got[i, :len(s) - 1], alone, atol=1e-5, rtol=0)
    with torch.no_grad():
        hot = token_logprobs(model, ids, attn, chunk_tokens=chunk, temperature=2.0)
        ref_hot = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, :-1] / 2.0, -1) \
            .gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(hot[valid], ref_hot[valid], atol=1e-5, rtol=0)


def test_token_logprobs_gradients_match_unchunked(tiny_model_dir, tokenizer):
    m = _load(tiny_model_dir)
    _, ids, attn = _padded_batch(tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=g) * attn[:, 1:]

    def grads(fn):
        m.zero_grad(set_to_none=True)
        (fn() * weights).sum().backward()
        return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}

    ref = grads(lambda: _reference_logprobs(m, ids, attn))
    assert len(ref) == len(list(m.parameters()))
    for chunk in (1, 3, 1000):
        got = grads(lambda: token_logprobs(m, ids, attn, chunk_tokens=chunk))
        assert got.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4, msg=f"{name} chunk={chunk}")


def _traj(prompt, response, mask, adv=None):
    return Trajectory(task_id="t", group_id=0, prompt_ids=list(prompt), response_ids=list(response),
                      loss_mask=list(mask), turn_spans=[(0, len(response))],
                      rollout_logprobs=[-0.5 - 0.1 * j if m else 0.0 for j, m in enumerate(mask)],
                      policy_version=0, advantages=adv)


def test_collate_and_response_values_alignment(model, tokenizer):
    micro = [
        _traj(_prompt(tokenizer), [40, 41, 42, 43, 44], [1, 1, 0, 0, 1], adv=[0.5, 0.5, 0.0, 0.0, 0.5]),
        _traj([7, 8], [50, 51, 52], [1, 1, 1], adv=None),
        _traj([9, 10, 11, 12], [60], [1], adv=[-1.0]),
    ]
    batch = collate(micro, tokenizer.pad_token_id, "cpu")
    T = max(t.num_tokens for t in micro)
    assert batch["input_ids"].shape == (3, T) and batch["loss_mask"].shape == (3, T - 1)
    for i, t in enumerate(micro):
        seq = t.token_ids.tolist()
        assert batch["input_ids"][i, :len(seq)].tolist() == seq
        assert batch["attention_mask"][i].tolist() == [1] * len(seq) + [0] * (T - len(seq))
        assert torch.all(batch["input_ids"][i, len(seq):] == tokenizer.pad_token_id)
        start = len(t.prompt_ids) - 1
        for j in range(len(t.response_ids)):
            col = start + j
            # Column col scores input_ids[col+1], which is response token j.
            assert batch["input_ids"][i, col + 1].item() == t.response_ids[j]
            assert batch["loss_mask"][i, col].item() == t.loss_mask[j]
            assert batch["rollout_logprobs"][i, col].item() == pytest.approx(t.rollout_logprobs[j])
            expected = t.advantages[j] if t.advantages is not None else 0.0
            assert batch["advantages"][i, col].item() == pytest.approx(expected)
        # Nothing outside the response span.
        outside = torch.ones(T - 1, dtype=torch.bool)
        outside[start:start + len(t.response_ids)] = False
        assert torch.all(batch["loss_mask"][i, outside] == 0)
        assert torch.all(batch["rollout_logprobs"][i, outside] == 0)
    assert batch["loss_mask"].sum().item() == sum(t.num_action_tokens for t in micro)

    # response_values is the inverse of the layout.
    assert [v.tolist() for v in response_values(micro, batch["loss_mask"])] == [t.loss_mask.tolist() for t in micro]
    for vals, t in zip(response_values(micro, batch["rollout_logprobs"]), micro):
        assert vals.tolist() == pytest.approx(t.rollout_logprobs.tolist())

    # With the model: the values read back for response token j are log p(response[j] | prompt, response[:j]).
    with torch.no_grad():
        lp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], chunk_tokens=4)
    for vals, t in zip(response_values(micro, lp), micro):
        expected = _full_logprobs(model, t.prompt_ids, t.response_ids)
        assert vals.tolist() == pytest.approx(expected, abs=1e-5)


def test_serialize_scalar_tensor():
    payload, checksums = serialize({"scale": torch.tensor(1.5), "w": torch.ones(3)})
    assert verify(payload, checksums) == []
