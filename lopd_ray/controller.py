"""The controller: builds the actor groups from the config, then runs the training loop, one named stage per line.
It calls groups (utils/actor_group.py), never an actor."""
from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Optional

import numpy as np

from lopd_ray.actors import (build_bank, build_learners, build_rollout_workers, build_teachers,
                             replace_rollout_worker, wait_ready)
from lopd_ray.algorithms import make_algorithm
from lopd_ray.bank.keeper import BankKeeper
from lopd_ray.bank.seeding import cold_start_examples, cold_start_plan, seed_bank
from lopd_ray.bank.traces import ComposerInputs, entries_from_successes
from lopd_ray.config import Config, flat_settings, to_yaml
from lopd_ray.data.batching import plan_learner_batches
from lopd_ray.data.by_reference import attach_ref, fill_rows
from lopd_ray.data.groups import by_group, refill_groups
from lopd_ray.data.sampler import TaskSampler, sample_seed
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.envs import make_env
from lopd_ray.errors import RolloutError
from lopd_ray.faults import RunFaults
from lopd_ray.idle_updates import IdleUpdates
from lopd_ray.models.export import write_student
from lopd_ray.learner.weight_sync import WEIGHT_SYNCS
from lopd_ray.models import resolve_model_path
from lopd_ray.rollout.worker import RolloutRequest
from lopd_ray.teacher.contexts import CONTEXTS, make_context
from lopd_ray.teacher.group import TeacherGroup
from lopd_ray.teacher.weights import follow_rate
from lopd_ray.utils.actor_group import ActorGroup, Pending
from lopd_ray.utils.checkpoint import CheckpointManager
from lopd_ray.utils.logs import phase, say
from lopd_ray.utils.metrics import MetricsLogger, append_row, drop_rows_from
from lopd_ray.utils.progress import Progress
from lopd_ray.utils.rng import rng_state, set_rng_state
from lopd_ray.utils.rollout_dump import dump_failed_rollouts, dump_rollouts
from lopd_ray.utils.run_storage import RunStorage
from lopd_ray.utils.stats import rollout_metrics, token_weighted_mean
from lopd_ray.utils.timing import StageTimer
from lopd_ray.utils.watchdog import mark_progress

PROBE_SEED = 20_240_917


def held_out_probes(tasks, count: int) -> list[Trajectory]:
    """The first `count` held-out tasks as samples that were never played (eval.teacher): what a context provider
    reads of a sample (task index, text and id; each its own group and uid)."""
    return [Trajectory(tasks[i].task_id, i, [], [], [], [], [], -1, task_index=i, task_text=tasks[i].user_text, uid=i)
            for i in range(count)]


def check_failures(failed: list[Trajectory], sampled: int, rollout_cfg) -> None:
    """A step where more than rollout.max_failed_fraction of the episodes failed after their retries stops."""
    if failed and len(failed) > rollout_cfg.max_failed_fraction * sampled:
        raise RolloutError(f"{len(failed)} of {sampled} episodes failed after rollout.max_retries="
                           f"{rollout_cfg.max_retries} retries (more than rollout.max_failed_fraction="
                           f"{rollout_cfg.max_failed_fraction}); the first, on task {failed[0].task_id}: "
                           f"{failed[0].error}. Fix the env or the model, or raise rollout.max_failed_fraction")


class Controller:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        os.makedirs(cfg.run_dir, exist_ok=True)
        with open(os.path.join(cfg.run_dir, "config.yaml"), "w") as f:
            f.write(to_yaml(cfg))
        self.algorithm = make_algorithm(cfg.algorithm)
        self.model_path = resolve_model_path(cfg.model.path)
        _, self.tasks = make_env(cfg.env)
        self.held_out_tasks = make_env(cfg.held_out_env)[1] if cfg.eval.every_steps else []
        self.held_out_size = len(self.held_out_tasks)
        self.sampler = TaskSampler(len(self.tasks), cfg.train.prompts_per_step, cfg.train.seed)
        needs_teacher = self.algorithm.needs_teacher
        self.learners = build_learners(cfg, self.model_path, wait=False)
        self.workers = build_rollout_workers(cfg, self.model_path, wait=False, renew=self.replace_worker)
        self.ahead: Optional[Pending] = None  # train.mode=async: the next batch's first round, in flight
        self.stale_dropped = 0  # over the run
        self.teacher_steps_skipped = 0  # over the run: teacher steps after a skipped student step
        self.bank_keeper, self.bank = None, None
        if needs_teacher and CONTEXTS[cfg.context.name].needs_bank:
            self.bank_keeper = BankKeeper(lambda: build_bank(cfg)[0], self.fill_bank_initially)
            self.bank = self.bank_keeper.bank = build_bank(cfg, wait=False, renew=self.bank_keeper.renew)
        self.teachers = (build_teachers(cfg, self.model_path, wait=False, renew=self.rebuild_teachers)
                         if needs_teacher else ActorGroup("TeacherWorker", transport=self.learners.transport))
        groups = [group for group in self.actor_groups().values() if group]
        with phase("starting " + ", ".join(f"{len(group)} {group.kind}" for group in groups)):
            wait_ready(groups, cfg.ray.startup_timeout_s)
        self.context = make_context(cfg, self.tasks, self.bank, self.complete_with_student) if needs_teacher else None
        # eval.teacher: a provider of the same kind over the held-out split (in the training one's state at each
        # evaluation), so that a held-out task gets what a sample of it would get now
        self.held_out_context = (make_context(cfg, self.held_out_tasks, self.bank, self.complete_with_student)
                                 if cfg.eval.teacher else None)
        self.teacher_group = TeacherGroup(cfg, self.algorithm, self.teachers, self.on_learners,
                                          CONTEXTS[cfg.context.name].scorers if needs_teacher else ())
        followers = self.teachers if follow_rate(cfg.teacher) is not None else None
        self.weight_sync = WEIGHT_SYNCS[cfg.sync.method](cfg, self.learners, self.workers, followers)
        self.checkpoints = CheckpointManager(cfg.run_dir, cfg.run.keep_checkpoints)
        self.faults = RunFaults(cfg.run_dir, self.checkpoints, self.actor_groups, self.learners)
        self.storage = RunStorage(cfg.run_uri, cfg.run_dir) if cfg.run_uri else None  # a URI run.output_dir
        self.last_checkpoint: Optional[str] = None  # restored from or saved last: what a rebuilt teacher loads
        # What the run has used so far, the x axes of the held-out curves (saved with each checkpoint).
        self.consumed = {"episodes": 0, "tokens": 0, "train_seconds": 0.0}
        self.teacher_caught_up = False  # eval.teacher: the run said that its teacher is no better than its student
        self.idle_updates = IdleUpdates(cfg.run.max_idle_updates)
        self.start_step = self.restore()
        if self.start_step == 0 and self.bank is not None:
            self.fill_bank_initially(self.bank)
        if self.start_step == 0 and cfg.composer.cold_start_steps > 0 and self.teachers:
            self.cold_start_composer()
        self.metrics = MetricsLogger(cfg.run_dir, cfg.run.loggers, self.start_step, flat_settings(cfg))
        self.eval_path = os.path.join(cfg.run_dir, "eval.jsonl")
        drop_rows_from(self.eval_path, "updates", self.start_step)

    # ---- the loop ---------------------------------------------------------------------------------------------
    def run(self) -> None:
        cfg, algo = self.cfg, self.algorithm
        self.sync_weights(self.start_step, StageTimer())
        if cfg.eval.every_steps:
            self.held_out_eval(self.start_step)
        with Progress(self.start_step, cfg.train.total_steps, enabled=cfg.run.progress_bar) as progress:
            self.last_logged = time.perf_counter()
            for step in range(self.start_step, cfg.train.total_steps):
                mark_progress(step=step)
                timer = StageTimer()
                with timer("rollout"):
                    trajs, stats = self.rollout(step)  # train.mode=async: generated while the last step trained
                if self.runs_ahead(step):
                    stats.update(self.start_next_batch(step, timer))
                if algo.needs_teacher:
                    with timer("context"):
                        stats.update(self.attach_context(trajs, step))
                    with timer("score_teacher"):
                        self.teacher_group.score(trajs)
                        stats.update(self.context.observe(trajs))
                with timer("learn"):
                    stats.update(self.learn(trajs))
                # the teacher's own step runs while the weights sync and the next batch starts
                teacher_update = self.start_teacher_update(trajs, stats) if algo.needs_teacher else None
                if self.ahead is None:  # else the workers take the new weights once the batch in flight is in
                    stats.update(self.sync_weights(step + 1, timer))
                    if self.next_batch_may_start(step):  # on-policy: the workers hold the weights it trains
                        self.ahead = self.start_round(step + 1, 0)
                with timer("bank_add"):
                    stats.update(self.bank_add(trajs))
                if teacher_update is not None:
                    stage, finish = teacher_update
                    with timer(stage):
                        stats.update(finish())
                self.consumed["train_seconds"] += timer.total()
                if self.eval_due(step + 1):
                    with timer("held_out_eval"):
                        stats.update(self.held_out_eval(step + 1))
                self.log(step, trajs, stats, timer, progress)  # before the checkpoint, so a kill cannot lose the row
                self.maybe_checkpoint(step)
                self.idle_updates.observe(step, stats, len(trajs))  # a run that stopped learning ends, saying why
        if cfg.run.export_student:
            self.export_student()
        self.metrics.close()
        self.upload()

    def run_or_name_the_lost_actor(self) -> None:
        """`run()`, watched for progress (run.step_timeout_s); each way it can end early is one error line naming
        where it stopped and where `run.resume=auto` continues from (lopd_ray/faults.py)."""
        self.faults.watch(self.run, self.cfg.run.step_timeout_s)

    def actor_groups(self) -> dict[str, ActorGroup]:
        """Every group of the run by kind, the ones a run cannot replace first."""
        bank = [self.bank] if self.bank is not None else []
        return {group.kind: group for group in (self.learners, self.teachers, *bank, self.workers)}

    # ---- stages -----------------------------------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """train.prompts_per_step groups of train.samples_per_prompt samples. An algorithm with refill rounds (DAPO's
        dynamic sampling) replaces the groups it cannot learn from with groups of fresh prompts. Episodes that failed
        after their retries are left out, counted and dumped; too many of them stop the run."""
        algo, failed, sampled = self.algorithm, [], []

        def roll(round_: int) -> list[list[Trajectory]]:
            """A round's groups of the episodes that did not fail (a failed one never trains) nor were generated
            more than train.max_staleness updates ago."""
            trajs = self.finish_round(self.ahead or self.start_round(step, round_))
            self.ahead = None
            sampled.extend(trajs)
            failed.extend(t for t in trajs if t.error)
            stale = {t.group_id for t in trajs if step - t.policy_version > self.cfg.train.max_staleness}
            self.stale_dropped += sum(t.group_id in stale for t in trajs)
            return list(by_group([t for t in trajs if not t.error and t.group_id not in stale]).values())

        groups, drawn = refill_groups(roll(0), algo.informative, roll, self.cfg.train.prompts_per_step,
                                      algo.refill_rounds)
        check_failures(failed, len(sampled), self.cfg.rollout)
        dump_failed_rollouts(self.cfg.run_dir, step, failed, self.model_path)
        trajs = [t for members in groups for t in members]
        self.consumed["episodes"] += len(sampled)
        self.consumed["tokens"] += sum(t.num_action_tokens for t in sampled)
        for uid, t in enumerate(trajs):
            t.uid = uid
        stats = {"rollout/failed_episodes": float(len(failed)),
                 "rollout/retried_episodes": float(sum(t.attempts > 1 for t in sampled)),
                 "rollout/worker_restarts": float(self.workers.restarts),
                 "rollout/stale_dropped": float(self.stale_dropped)}
        return trajs, {**stats, **({"rollout/refill_rounds": float(drawn)} if algo.refill_rounds else {})}

    def next_batch_may_start(self, step: int) -> bool:
        """Whether the batch of step+1 may be started before step ends: not when a checkpoint or a held-out
        evaluation comes after step (both need the workers idle with the learners' weights; a resume from that
        checkpoint then generates exactly what the run would have)."""
        return (step + 1 < self.cfg.train.total_steps and not self.checkpoint_due(step)
                and not self.eval_due(step + 1))

    def runs_ahead(self, step: int) -> bool:
        """train.mode=async: the batch of step+1 is generated while step trains."""
        return self.cfg.train.mode == "async" and self.next_batch_may_start(step)

    def start_next_batch(self, step: int, timer: StageTimer) -> dict[str, float]:
        """The workers take the learners' weights (those of `step`) if the next batch would otherwise train more
        than train.max_staleness updates after its weights, then start on it."""
        stats = {}
        if self.weight_sync.version < step + 1 - self.cfg.train.max_staleness:
            stats = self.sync_weights(step, timer)
        self.ahead = self.start_round(step + 1, 0)
        return stats

    def start_round(self, step: int, round_: int) -> Pending:
        """Fresh prompts from the sampler, each sampled train.samples_per_prompt times across the workers."""
        seed, per_prompt = self.cfg.train.seed, self.cfg.train.samples_per_prompt
        task_indices = self.sampler.next()
        n = len(task_indices)
        first_group = (step * (1 + self.algorithm.refill_rounds) + round_) * n  # group ids unique in the run
        requests = [RolloutRequest(task_index, first_group + p,
                                   sample_seed(seed, step, (round_ * n + p) * per_prompt + k))
                    for p, task_index in enumerate(task_indices) for k in range(per_prompt)]
        return self.workers.scatter("rollout", self.workers.split(requests))

    def finish_round(self, calls: Pending) -> list[Trajectory]:
        """The round's trajectories, each knowing where the actors find its rollout arrays (data/by_reference.py)."""
        parts = calls.wait()
        for part, ref in zip(parts, calls.answer_refs):
            for position, t in enumerate(part):
                t.rollout_ref = (ref, position)
        return [t for part in parts for t in part]

    def replace_worker(self, i: int) -> None:
        """A new rollout worker in place of worker i, holding the weights the others hold."""
        replace_rollout_worker(self.cfg, self.model_path, self.workers, i)
        self.weight_sync.push_to([i], self.weight_sync.version)

    def eval_due(self, updates: int) -> bool:
        every = self.cfg.eval.every_steps
        return every > 0 and (updates % every == 0 or updates == self.cfg.train.total_steps)

    def held_out_eval(self, updates: int) -> dict[str, float]:
        """The student alone on eval.split after `updates` updates (with eval.teacher, the teacher too): one row of
        <run>/eval.jsonl (with what the run had used to get there) and its `eval/` metrics."""
        ev = self.cfg.eval
        count = min(ev.tasks or self.held_out_size, self.held_out_size)
        teacher = self.start_teacher_eval(count, updates) if ev.teacher else None
        requests = [RolloutRequest(i, i, PROBE_SEED + i) for i in range(count)]
        parts = self.workers.call_scattered("evaluate_held_out", self.workers.split(requests))
        rewards = np.asarray([t.reward for part in parts for t in part], dtype=np.float64)
        metrics = {"eval/reward_mean": float(rewards.mean()), "eval/solved": float((rewards >= 1.0).mean()),
                   "eval/failed": float(sum(t.error is not None for part in parts for t in part))}
        if teacher is not None:
            metrics.update(self.watch_teacher(rewards, *teacher(), updates))
        append_row(self.eval_path, {"updates": updates, **self.consumed, "tasks": count,
                                    **{k.split("/")[1]: v for k, v in metrics.items()}})
        return metrics

    def start_teacher_eval(self, count: int, updates: int) -> Callable[[], tuple[list[int], list[float]]]:
        """The teacher's greedy episodes of the first `count` held-out tasks under what its context provider gives
        them now, begun on the teacher ranks so that they play while the rollout workers evaluate the student; the
        function returned waits for (the tasks that got a context, the teacher's rewards on them)."""
        probes = held_out_probes(self.held_out_tasks, count)
        self.held_out_context.load_state_dict(self.context.state_dict())
        self.held_out_context.attach(probes, updates)
        played = [t for t in probes if t.teacher_context is not None]
        finish = self.teacher_group.start_held_out(played)
        return lambda: ([t.task_index for t in played], finish())

    def watch_teacher(self, student: np.ndarray, tasks: list[int], rewards: list[float],
                      updates: int) -> dict[str, float]:
        """The teacher's mean held-out reward over the tasks it had a context for; the first time it comes within
        eval.teacher_margin of the student's on those tasks, one line says so."""
        if not tasks:
            return {"eval/teacher_tasks": 0.0}
        teacher, alone, margin = float(np.mean(rewards)), float(student[tasks].mean()), self.cfg.eval.teacher_margin
        if teacher <= alone + margin and not self.teacher_caught_up:
            self.teacher_caught_up = True
            say(f"Teacher no better than its student at update {updates}: held-out reward {teacher:.3f} against the "
                f"student's {alone:.3f} on the same {len(tasks)} tasks (eval.teacher_margin={margin:g}); its context "
                f"no longer carries what the student lacks.")
        return {"eval/teacher_reward_mean": teacher, "eval/teacher_tasks": float(len(tasks))}

    def complete_with_student(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy answers of the student to single user messages, spread over the rollout workers, in order."""
        parts = self.workers.call_scattered("complete", self.workers.split(prompts), max_new_tokens)
        return [text for part in parts for text in part]

    def fill_bank_initially(self, bank: ActorGroup) -> None:
        """The bank at step 0: `bank.init_path`'s snapshot, then the seeded reference solutions."""
        if self.cfg.bank.init_path:
            bank.first("restore", self.cfg.bank.init_path)
        seed_bank(bank, self.tasks, self.cfg.bank)

    def attach_context(self, trajs: list[Trajectory], step: int) -> dict[str, float]:
        """The teacher's privileged context for each trajectory (a retrieval survives a bank restart)."""
        return self.context.attach(trajs, step)

    def bank_add(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Successful trajectories enter the bank as observation-lite traces (none with bank.static)."""
        if self.bank is None:
            return {}
        retrieval = self.bank.first("stats")  # of this step's retrieval: a bank lost in the add forgets them
        if not self.cfg.bank.static:
            self.bank_keeper.add(entries_from_successes(trajs, self.cfg.bank))
        return {**retrieval, "bank/size": float(self.bank.first("size")), "bank/restarts": float(self.bank.restarts)}

    def rebuild_teachers(self) -> None:
        """A new teacher group in place of a lost one (the same list, so every holder sees it), in the last
        checkpoint's teacher state: composer, dual variable, a moving backbone and its optimizer. Before the first
        checkpoint, the run's start state: a fresh group, cold-started again if the run was."""
        self.teachers.release()
        with phase(f"rebuilding the teacher group ({len(self.teachers)} ranks)"):
            self.teachers.take(build_teachers(self.cfg, self.model_path))
            if self.last_checkpoint is not None:
                self.teachers.start("load_checkpoint", self.last_checkpoint).wait(self.cfg.run.checkpoint_timeout_s)
            elif self.cfg.composer.cold_start_steps > 0:
                self.cold_start_composer()

    def cold_start_composer(self) -> None:
        """Optional first phase (METHOD 2.4) on the reference solutions that seeded the bank."""
        examples = cold_start_examples(self.bank, self.tasks, self.cfg.bank,
                                       ComposerInputs(self.cfg.composer, self.model_path))
        steps = self.cfg.composer.cold_start_steps
        with phase(cold_start_plan(self.cfg.composer, len(examples))):
            stats = self.teachers.start("cold_start", examples, steps).wait(float("inf"))[0]
        print(f"Composer cold start: the reference answers' NLL went from {stats.get('cold_start/nll_first', 0.0):.3g} "
              f"to {stats.get('cold_start/nll_last', 0.0):.3g} in {steps} steps.", flush=True)

    def start_teacher_update(self, trajs: list[Trajectory], stats: dict[str, float]):
        """The teacher's own step (TeacherGroup.start_update) after a student step that was taken; after a skipped
        one (nothing to train on, or a non-finite gradient norm) it is skipped too, as the official LOPD code skips
        its composer step, and counted in teacher/skipped_steps."""
        if stats.get("actor/skipped_update") or not math.isfinite(stats.get("actor/grad_norm", 0.0)):
            self.teacher_steps_skipped += 1
            update = None
        else:
            update = self.teacher_group.start_update(trajs)
        stats["teacher/skipped_steps"] = float(self.teacher_steps_skipped)
        return update

    def learn(self, trajs: list[Trajectory]) -> dict[str, float]:
        kept, stats = self.algorithm.prepare(trajs)
        if not kept:
            return {**stats, "actor/skipped_update": 1.0}
        le = self.cfg.learner
        plans, norms = plan_learner_batches(kept, len(self.learners), le.updates_per_step,
                                            le.max_tokens_per_micro_batch)
        calls = self.learners.scatter("train_step_by_reference", [plan.shipped() for plan in plans], norms)
        results = calls.wait()
        for plan, (_, signals), blob in zip(plans, results, calls.blobs):
            fill_rows(plan.trajectories(), signals)
            if signals:
                attach_ref(plan.trajectories(), blob)
        if self.algorithm.wants_updated_logprobs:
            stats.update(self.algorithm.update_diagnostics(kept, self.score_with_learners(kept,
                                                                                          at_train_temperature=True)))
        return {**stats, **token_weighted_mean([m for m, _ in results], "actor/tokens"), "actor/skipped_update": 0.0}

    def sync_weights(self, version: int, timer: StageTimer) -> dict[str, float]:
        with timer("sync_weights"):  # a following teacher found dead is rebuilt and the push made again
            stats = self.teachers.surviving("weight sync", lambda: self.push_replacing_lost_workers(version),
                                            self.teachers.holds)
        sc = self.cfg.sync
        due = version == self.start_step or version % sc.probe_every == 0 or version == self.cfg.train.total_steps
        if sc.probe_prompts > 0 and due:
            with timer("sync_probe"):
                stats.update(self.probe_sync())
        return stats

    def push_replacing_lost_workers(self, version: int) -> dict[str, float]:
        """The push of `version`; a rollout worker lost in it is replaced by one holding the last weights pushed,
        and the push made again (at most rollout.max_worker_restarts replacements). A lost teacher or learner is
        the caller's to handle or to name."""
        replaced = 0
        while True:
            try:
                return self.weight_sync.push(version)
            except Exception as exc:
                if self.teachers.holds(exc) or self.workers.restart is None or self.learners.lost_members():
                    raise
                lost = self.workers.lost_members()
                if not lost:
                    raise
                for i in lost:
                    self.workers.replace_member(i, f"died during the weight sync of version {version}", replaced)
                    replaced += 1

    def probe_sync(self) -> dict[str, float]:
        """Each worker samples a fixed probe batch; the learners re-score it in fp32; the difference of the two
        log-probs of the sampled tokens says whether the engines hold the learners' weights."""
        sc = self.cfg.sync
        requests = [RolloutRequest(i % len(self.tasks), -1, PROBE_SEED + i) for i in range(sc.probe_prompts)]
        parts = self.workers.call("probe", requests, sc.probe_max_new_tokens)
        trajs = [t for part in parts for t in part]
        scores = self.score_with_learners(trajs)
        diffs = np.concatenate([np.abs(t.rollout_logprobs.astype(np.float64) - s)[t.loss_mask == 1]
                                for t, s in zip(trajs, scores)])
        return {"sync/logprob_diff_mean": float(diffs.mean()), "sync/logprob_diff_max": float(diffs.max())}

    def score_with_learners(self, trajs: list[Trajectory], at_train_temperature: bool = False) -> list[np.ndarray]:
        """The learners' log-probs of each trajectory's sampled response tokens ([R] arrays, at the rollout
        temperature or `at_train_temperature`; see PolicyLearner.score), in the input order."""
        by_position = {id(t): i for i, t in enumerate(trajs)}
        plans, _ = plan_learner_batches(trajs, len(self.learners), 1, self.cfg.learner.max_tokens_per_micro_batch)
        results = self.learners.call_scattered("score", plans, False, at_train_temperature)
        scored = {}
        for plan, values in zip(plans, results):
            scored.update(zip((by_position[id(t)] for t in plan.trajectories()), values))
        return [scored[i] for i in range(len(trajs))]

    def on_learners(self, trajs: list[Trajectory], method: str, *args) -> list[tuple[list[Trajectory], Any, Any]]:
        """`method` of the learners (one of PolicyLearner's scorers, data/signals.py) on `trajs`: per learner, the
        trajectories of its plan, its answer and its blob."""
        plans, _ = plan_learner_batches(trajs, len(self.learners), 1, self.cfg.learner.max_tokens_per_micro_batch)
        calls = self.learners.scatter(method, [plan.shipped() for plan in plans], *args)
        return list(zip([plan.trajectories() for plan in plans], calls.wait(), calls.blobs))

    # ---- bookkeeping ------------------------------------------------------------------------------------------
    def log(self, step, trajs, stats, timer, progress) -> None:
        mark_progress("log")
        metrics = {**rollout_metrics(trajs, step), **stats, **timer.metrics()}
        if self.teachers:
            metrics["teacher/restarts"] = float(self.teacher_group.restarts)
        now = time.perf_counter()  # the whole step as a user waits for it: the stages and the driver's own work
        metrics["timing_s/wall"], self.last_logged = now - self.last_logged, now
        self.metrics.log(step, metrics)
        dump_rollouts(self.cfg.run_dir, step, trajs, self.cfg.run.rollouts_logged_per_step, self.model_path)
        progress.update(step, metrics)

    def export_student(self) -> str:
        """Writes the student to <run>/export as an HF directory; returns its path."""
        mark_progress("export")
        exports = self.learners.call("export_weights", timeout_s=self.cfg.sync.timeout_s)
        out = write_student(exports[0]["payload"], self.model_path, os.path.join(self.cfg.run_dir, "export"))
        say(f"Student exported to {out}.")
        return out

    def checkpoint_due(self, step: int) -> bool:
        every = self.cfg.run.checkpoint_every_steps
        return every > 0 and ((step + 1) % every == 0 or step + 1 == self.cfg.train.total_steps)

    def maybe_checkpoint(self, step: int) -> None:
        if self.checkpoint_due(step):
            mark_progress("checkpoint")
            start = time.perf_counter()
            directory = self.save_checkpoint(step + 1)
            self.upload()
            say(f"Checkpoint {directory} written in {time.perf_counter() - start:.1f} s.")

    def upload(self) -> None:
        """With a URI run.output_dir, the run's files as they are now go there (lopd_ray/utils/run_storage.py)."""
        if self.storage is not None:
            self.storage.upload()
            say(f"Uploaded to {self.storage.uri}.")

    def save_checkpoint(self, next_step: int) -> str:
        def write_parts(directory: str) -> None:
            parts = self.learners.start("save_checkpoint", directory)
            self.teacher_group.save_checkpoint(directory)
            parts.wait(self.cfg.run.checkpoint_timeout_s)
            if self.bank is not None:
                self.bank.first("snapshot", os.path.join(directory, "bank"))

        state = {"next_step": next_step, "sampler": self.sampler.state_dict(), "rng": rng_state(),
                 "context": self.context.state_dict() if self.context is not None else {},
                 "algorithm": self.algorithm.state_dict(), "consumed": self.consumed,
                 "teacher_caught_up": self.teacher_caught_up}
        directory = self.last_checkpoint = self.checkpoints.save(next_step, write_parts, state)
        if self.bank_keeper is not None:
            self.bank_keeper.snapshot_kept(directory)
        return directory

    def restore(self) -> int:
        directory = self.checkpoints.resolve(self.cfg.run.resume)
        if directory is None:
            return 0
        state = CheckpointManager.load_controller_state(directory)
        self.last_checkpoint = directory
        parts = [self.learners.start("load_checkpoint", directory), self.teachers.start("load_checkpoint", directory)]
        parts += [self.bank.start("restore", os.path.join(directory, "bank"))] if self.bank is not None else []
        for calls in parts:
            calls.wait(self.cfg.run.checkpoint_timeout_s)
        if self.bank_keeper is not None:
            self.bank_keeper.snapshot_kept(directory)
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        if self.context is not None:
            self.context.load_state_dict(state.get("context", {}))
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        self.consumed.update(state.get("consumed", {}))
        self.teacher_caught_up = state.get("teacher_caught_up", False)
        print(f"Resumed from {directory}: the run goes on at step {state['next_step']}.", flush=True)
        return state["next_step"]

    def shutdown(self) -> None:
        if not self.faults.interrupted:  # the workers still busy after rollout.shutdown_timeout_s are killed below
            self.workers.settle("shutdown", self.cfg.rollout.shutdown_timeout_s)
        for group in self.actor_groups().values():
            group.release()
