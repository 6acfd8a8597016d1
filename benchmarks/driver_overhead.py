"""The driver's own work on one LOPD step at cluster scale: time and memory, with synthetic trajectories.

    python benchmarks/driver_overhead.py [--samples 512] [--tokens 4096] [--top-m 20] [--learners 8] [--out FILE]

What the controller does with a step's data between the actors, stage by stage, on trajectories made in other
processes (Ray tasks standing in for the rollout workers, the teacher ranks and the learners, returning what those
actors return, so that every array travels as it does in a run; lopd_ray/data/by_reference.py): the rollouts in
(`--samples` trajectories of `--tokens` response tokens), the teacher's batch out, its [R] scores in and the
references of its [R, M] top-M ids and log-probs attached, the algorithm's `prepare`, the learners' plans made and
serialized into the object store (what `train_step_by_reference.remote` does), the student's [R] log-probs back and
the reference of its [R, M] ones attached, the composer's batch serialized, the step's metrics. The stand-ins fetch
what they read through the references (the rollout's arrays from the rollout's own return objects), as the actors
do. Seconds per stage (the median of
`--repeats`), the bytes of per-token arrays that pass through the driver and those that go by reference, and the
driver's peak of traced allocations (numpy's included) over the step: a copy of the wide arrays in the driver would
show there.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc

import numpy as np
import results_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT_TOKENS = 256


def make_rollouts(first_uid: int, count: int, tokens: int, seed: int) -> list:
    from lopd_ray.data.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        uid = first_uid + i
        t = Trajectory(f"task{uid // 4}", uid // 4, rng.integers(0, 49_000, PROMPT_TOKENS),
                       rng.integers(0, 49_000, tokens), np.ones(tokens, np.int32), [(0, tokens)],
                       -rng.random(tokens, np.float32), 0, reward=float(rng.random() > 0.5), task_text="t",
                       action_texts=["a"], observation_texts=[])
        t.uid = uid
        out.append(t)
    return out


def teacher_scores(trajs: list, top_m: int, seed: int) -> tuple[dict, dict]:
    """What TeacherWorker.teacher_scores returns: the [R] signals and the blob of the [R, M] ones (after fetching
    the rollout's arrays, as it does)."""
    from lopd_ray.data.by_reference import fetch_arrays
    from lopd_ray.data.signals import ship

    fetch_arrays(trajs)
    rng = np.random.default_rng(seed)
    tokens = len(trajs[0].response_ids)
    return ship({t.uid: {"teacher_logprobs": -rng.random(tokens, np.float32),
                         "teacher_entropy": rng.random(tokens, np.float32),
                         "teacher_topm_ids": rng.integers(0, 49_000, (tokens, top_m)),
                         "teacher_topm_logprobs": -rng.random((tokens, top_m), np.float32)} for t in trajs})


def train_step(plan, top_m: int) -> tuple[tuple, dict]:
    """What PolicyLearner.train_step_by_reference returns, after fetching the plan's arrays as it does."""
    from lopd_ray.data.by_reference import fetch_arrays
    from lopd_ray.data.signals import ship

    trajs = plan.trajectories()
    fetch_arrays(trajs)
    assert all(t.teacher_topm_ids.shape == (len(t.response_ids), top_m) and t.loss_mask is not None for t in trajs)
    rng = np.random.default_rng(0)
    rows, blob = ship({t.uid: {"student_logprobs": -rng.random(len(t.response_ids), np.float32),
                               "student_topm_logprobs": -rng.random((len(t.response_ids), top_m), np.float32)}
                       for t in trajs})
    return ({}, rows), blob


def one_step(args, cfg, algorithm, remote) -> tuple[dict[str, float], int]:
    """The driver's stages of one step; returns their seconds and the traced peak (bytes)."""
    import ray

    from lopd_ray.data.batching import plan_learner_batches
    from lopd_ray.data.by_reference import attach_ref, fill_rows, views_with
    from lopd_ray.teacher.group import TEACHER_READS
    from lopd_ray.utils.stats import rollout_metrics

    workers = 4
    per_worker = args.samples // workers
    rollout_refs = [remote["rollouts"].remote(w * per_worker, per_worker, args.tokens, w) for w in range(workers)]
    ray.wait(rollout_refs, num_returns=len(rollout_refs))
    seconds = {}
    tracemalloc.start()
    tracemalloc.reset_peak()

    def stage(name, fn):
        start = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - start
        return result

    def rollouts_in():
        parts = ray.get(rollout_refs)
        for ref, part in zip(rollout_refs, parts):
            for position, t in enumerate(part):
                t.rollout_ref = (ref, position)
        return [t for part in parts for t in part]
    trajs = stage("rollouts_in", rollouts_in)
    shards = [trajs[w * per_worker:(w + 1) * per_worker] for w in range(workers)]
    shard_refs = stage("teacher_batch_out", lambda: [ray.put(views_with(shard, TEACHER_READS)) for shard in shards])
    scores = [remote["scores"].remote(ref, args.top_m, w) for w, ref in enumerate(shard_refs)]
    ray.wait([light for light, _ in scores], num_returns=len(scores))

    def attach_scores():
        for shard, (light, blob) in zip(shards, scores):
            fill_rows(shard, ray.get(light))
            attach_ref(shard, blob)
    stage("teacher_scores_in", attach_scores)
    kept, _ = stage("algorithm_prepare", lambda: algorithm.prepare(trajs))
    plans, _ = stage("plan", lambda: plan_learner_batches(kept, args.learners, 1, 2 * (args.tokens + PROMPT_TOKENS)))
    plan_refs = stage("plans_out", lambda: [ray.put(plan.shipped()) for plan in plans])
    calls = [remote["learner"].remote(ref, args.top_m) for ref in plan_refs]
    ray.wait([light for light, _ in calls], num_returns=len(calls))

    def attach_student():
        for plan, (light, blob) in zip(plans, calls):
            fill_rows(plan.trajectories(), ray.get(light)[1])
            attach_ref(plan.trajectories(), blob)
    stage("student_logprobs_in", attach_student)
    composer_refs = stage("composer_batch_out", lambda: [ray.put(views_with(shard, TEACHER_READS))
                                                         for shard in [kept[w::workers] for w in range(workers)]])
    stage("metrics", lambda: rollout_metrics(trajs, 0))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert all(t.teacher_topm_ids is None and t.student_topm_logprobs is None for t in trajs)
    del plan_refs, composer_refs, shard_refs
    return seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--top-m", type=int, default=20)
    parser.add_argument("--learners", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "driver_overhead.json"))
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    import ray

    from lopd_ray.algorithms import make_algorithm
    from lopd_ray.config import load_config
    from lopd_ray.utils.runtime import apply_runtime_env

    apply_runtime_env()
    cfg = load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"), [f"teacher.top_m={args.top_m}"])
    algorithm = make_algorithm(cfg.algorithm)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    remote = {"rollouts": ray.remote(make_rollouts), "scores": ray.remote(num_returns=2)(teacher_scores),
              "learner": ray.remote(num_returns=2)(train_step)}
    per_token = args.samples * args.tokens
    # token ids, loss mask and rollout log-probs; the teacher's sampled log-prob and entropy; the student's
    bytes_through = {"rollouts": per_token * (8 + 4 + 4), "teacher_scores": per_token * 8,
                     "student_logprobs": per_token * 4}
    bytes_by_reference = {"teacher_topm": per_token * args.top_m * 12, "student_topm": per_token * args.top_m * 4}
    runs = [one_step(args, cfg, algorithm, remote) for _ in range(args.repeats)]
    ray.shutdown()
    stages = {name: statistics.median(run[0][name] for run in runs) for name in runs[0][0]}
    result = {"samples": args.samples, "tokens": args.tokens, "top_m": args.top_m, "learners": args.learners,
              "seconds": stages, "driver_seconds": sum(stages.values()),
              "traced_peak_bytes": statistics.median(peak for _, peak in runs), "array_bytes": bytes_through,
              "array_bytes_by_reference": bytes_by_reference}
    for name, value in stages.items():
        print(f"{name:22s} {value:7.3f} s")
    print(f"{'driver total':22s} {result['driver_seconds']:7.3f} s; traced peak "
          f"{result['traced_peak_bytes'] / 2**30:.2f} GiB; per-token arrays through the driver "
          f"{sum(bytes_through.values()) / 2**30:.2f} GiB, by reference "
          f"{sum(bytes_by_reference.values()) / 2**30:.2f} GiB", flush=True)
    results_file.write(args.out, result)


if __name__ == "__main__":
    main()
