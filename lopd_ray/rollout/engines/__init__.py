"""Engine registry: `rollout.engine` -> InferenceEngine class path (imported lazily: vLLM is heavy)."""
import importlib

ENGINES = {
    "vllm": "lopd_ray.rollout.engines.vllm_engine:VLLMEngine",
    "hf": "lopd_ray.rollout.engines.hf_engine:HFEngine",
}
# Engines that can shard a model over a worker's GPUs (rollout.tensor_parallel_size > 1).
SHARDING_ENGINES = ("vllm",)


def engine_class(name: str):
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)
