"""Engine registry: `rollout.engine` -> InferenceEngine class path (imported lazily: vLLM is heavy)."""
import importlib

ENGINES = {
    "vllm": "lopd_ray.rollout.engines.vllm_engine:VLLMEngine",
    "hf": "lopd_ray.rollout.engines.hf_engine:HFEngine",
}


def engine_class(name: str):
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)
