"""Teacher ranks as one data-parallel group, and teacher weights that follow the student (live / EMA)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import ray
import torch

from lopd_ray.actors import build_teachers
from lopd_ray.config import load_config
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.modeling.weights_io import deserialize, serialize
from lopd_ray.rollout.agent_loop import render_ids
from lopd_ray.teacher.injection import latent_context

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml")
ENTRIES = ["Task to solve:\nReply with the letter 'a' repeated 4 times.\n\nReference past trajectory:\nAction: aaaa",
           "Task to solve:\nReply with the letter 'b' repeated 6 times.\n\nReference past trajectory:\nAction: bbbbbb"]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def teacher_cfg(*overrides):
    return load_config(RECIPE, ["composer.lr=1e-2", *overrides])


def trajectories(tokenizer, tasks) -> list[Trajectory]:
    out = []
    for i, (text, reward) in enumerate([("aaaa", 1.0), ("zzzz", 0.0), ("bbbbbb", 1.0), ("ab", 0.3), ("a", 0.8)]):
        prompt = render_ids(tokenizer, tasks[i].messages, add_generation_prompt=True)
        response = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        t = Trajectory(tasks[i].task_id, 0, prompt, response, [1] * len(response), [(0, len(response))],
                       [0.0] * len(response), 0, reward=reward, task_index=i, retrieved_texts=ENTRIES,
                       teacher_context=latent_context(teacher_cfg().composer))
        t.retrieved_ids = ["entry0", "entry1"]
        out.append(t)
    return out


def phi_of(teacher) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in teacher.composer.phi_state_dict().items()}


def first_moments(teacher) -> list[torch.Tensor]:
    """Adam's first moments: after one step, 0.1 x the (clipped) gradient, so a gradient scaled wrong shows here
    even where Adam's normalized step would hide it."""
    optimizer = teacher.engine.optimizer
    base = getattr(optimizer, "optimizer", optimizer)
    return [base.state[p]["exp_avg"].clone() for p in teacher.composer.phi_parameters()]


def set_phi(teacher, state) -> None:
    teacher.composer.load_phi_state_dict(state)
    teacher.phi0 = {k: v.clone() for k, v in state.items()}


def backbone_of(teacher) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in teacher._backbone_parameters().items()}


def scored(teacher_group, trajs: list[Trajectory]) -> list[Trajectory]:
    for t, (ids, logp, sampled) in zip(trajs, ray.get(teacher_group[0].score.remote(trajs))):
        t.teacher_topm_ids, t.teacher_topm_logprobs = ids, logp
        # a student a little less sure than the teacher, so that the KL term has a gradient
        t.student_logprobs, t.student_topm_logprobs = sampled - 0.1, logp - 0.1
    return trajs


@pytest.mark.ray
def test_two_teacher_ranks_take_the_same_composer_steps_as_one(ray_cluster, tiny_model_dir):
    from transformers import AutoTokenizer

    from lopd_ray.envs import make_env

    cfg1, cfg2 = teacher_cfg("teacher.num_workers=1"), teacher_cfg("teacher.num_workers=2")
    one, two = build_teachers(cfg1, tiny_model_dir), build_teachers(cfg2, tiny_model_dir)
    try:
        start = ray.get(one[0].__ray_call__.remote(phi_of))
        for phi in ray.get([t.__ray_call__.remote(phi_of) for t in two]):  # every rank starts from the same phi
            assert all(torch.equal(phi[k], start[k]) for k in start)
        _, tasks = make_env(cfg1.env)
        trajs = scored(one, trajectories(AutoTokenizer.from_pretrained(tiny_model_dir), tasks))
        for split in (3, 5):  # uneven shards, then one rank with nothing (it still joins the all-reduce)
            # both groups start each step from the same phi and beta (the margin term counts too), so the step's
            # metrics can differ only by the order of float sums, not by the last step's Adam noise (*)
            ray.get([t.__ray_call__.remote(set_phi, start) for t in one + two])
            single = ray.get(one[0].update_composer.remote(trajs, 0.3, 0.05))
            double = ray.get([t.update_composer.remote(p, 0.3, 0.05)
                              for t, p in zip(two, (trajs[:split], trajs[split:]))])
            phi_one = ray.get(one[0].__ray_call__.remote(phi_of))
            phi_two = ray.get([t.__ray_call__.remote(phi_of) for t in two])
            moments_one = ray.get(one[0].__ray_call__.remote(first_moments))
            for moments_two in ray.get([t.__ray_call__.remote(first_moments) for t in two]):
                for a, b in zip(moments_one, moments_two, strict=True):
                    torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-3)
            assert double[0] == double[1]  # every rank reports the same metrics
            for key, value in single.items():
                assert double[0][key] == pytest.approx(value, rel=1e-5, abs=1e-9), (split, key)
            assert any(not torch.equal(phi_one[k], start[k]) for k in start)
            # (*) the moments above carry the exact comparison; Adam's normalized steps (about lr = 1e-2 each) turn
            # float noise in near-zero gradients into differences of a few 1e-4, so phi is compared against lr.
            for k in start:
                assert torch.equal(phi_two[0][k], phi_two[1][k]), (split, k)
                torch.testing.assert_close(phi_two[0][k], phi_one[k], atol=2e-3, rtol=0)  # (*)
            start = phi_one
    finally:
        one.release()
        two.release()


def held_share(teacher) -> float:
    """The share of the backbone's weights this rank holds."""
    params = list(teacher._backbone_parameters().values())
    return sum(p.ds_tensor.numel() for p in params) / sum(p.ds_numel for p in params)


def cold_started_phi(teacher, examples) -> dict[str, torch.Tensor]:
    teacher.cold_start(examples, 2)
    return phi_of(teacher)


@pytest.mark.ray
def test_a_sharded_teacher_scores_and_steps_as_a_whole_one(ray_cluster, tiny_model_dir):
    """teacher.zero_stage=3: each of two ranks holds half the backbone, and with uneven shards (one trajectory per
    micro-batch, two positions per head chunk: the ranks' passes differ in number and length) the group scores,
    cold-starts and steps the composer as one rank holding all of it."""
    from transformers import AutoTokenizer

    from lopd_ray.envs import make_env

    small = ["teacher.max_tokens_per_micro_batch=1", "teacher.logprob_chunk_tokens=2"]
    whole = build_teachers(teacher_cfg("teacher.num_workers=1", *small), tiny_model_dir)
    sharded = build_teachers(teacher_cfg("teacher.num_workers=2", "teacher.zero_stage=3", *small), tiny_model_dir)
    try:
        assert ray.get([t.__ray_call__.remote(held_share) for t in sharded]) == [0.5, 0.5]
        _, tasks = make_env(teacher_cfg().env)
        trajs = trajectories(AutoTokenizer.from_pretrained(tiny_model_dir), tasks)
        examples = [{"task_index": t.task_index, "answer": text, "retrieved_texts": ENTRIES}
                    for t, text in zip(trajs, ("aaaa", "bbbbbb", "ab"))]
        initial = ray.get(whole[0].__ray_call__.remote(phi_of))
        phi_whole = ray.get(whole[0].__ray_call__.remote(cold_started_phi, examples))
        assert max(float((phi_whole[k] - initial[k]).abs().max()) for k in initial) > 1e-3  # two steps of 3e-3
        phi_ranks = ray.get([t.__ray_call__.remote(cold_started_phi, examples) for t in sharded])
        for k in phi_whole:  # Adam's normalized steps turn float noise in near-zero gradients into ~1e-5
            assert torch.equal(phi_ranks[0][k], phi_ranks[1][k])
            torch.testing.assert_close(phi_ranks[0][k], phi_whole[k], atol=1e-4, rtol=0)
        start = phi_whole
        expected = ray.get(whole[0].score.remote(trajs))
        for split in (3, 5):
            got = ray.get([t.score.remote(p) for t, p in zip(sharded, (trajs[:split], trajs[split:]))])
            for (ids, logp, sampled), (ids_w, logp_w, sampled_w) in zip(got[0] + got[1], expected, strict=True):
                assert (ids == ids_w).all()
                np.testing.assert_allclose(logp, logp_w, atol=1e-5)
                np.testing.assert_allclose(sampled, sampled_w, atol=1e-5)
        trajs = scored(whole, trajs)
        for split in (3, 5):
            ray.get([t.__ray_call__.remote(set_phi, start) for t in whole + sharded])
            single = ray.get(whole[0].update_composer.remote(trajs, 0.3, 0.05))
            double = ray.get([t.update_composer.remote(p, 0.3, 0.05)
                              for t, p in zip(sharded, (trajs[:split], trajs[split:]))])
            assert double[0] == double[1]
            for key, value in single.items():
                assert double[0][key] == pytest.approx(value, rel=1e-4, abs=1e-7), (split, key)
            moments = ray.get(whole[0].__ray_call__.remote(first_moments))
            for moments_rank in ray.get([t.__ray_call__.remote(first_moments) for t in sharded]):
                for a, b in zip(moments, moments_rank, strict=True):
                    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-3)
            start = ray.get(whole[0].__ray_call__.remote(phi_of))
    finally:
        whole.release()
        sharded.release()


@pytest.fixture
def student_export(tiny_model_dir):
    """The tiny model's weights moved by a known amount, as a learner exports them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    named = {n: p.detach() + 0.1 * torch.randn(p.shape, generator=generator) for n, p in model.named_parameters()}
    named["lm_head.weight"] = named["model.embed_tokens.weight"]
    payload, checksums = serialize(named)
    return {"payload": payload, "checksums": checksums}


@pytest.mark.parametrize("weights,rate", [("live", 1.0), ("ema", 0.25)])
def test_teacher_weights_follow_the_student(tiny_model_dir, student_export, weights, rate):
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker

    teacher = LatentTeacherWorker(teacher_cfg(f"teacher.weights={weights}", "teacher.ema_rate=0.25"), tiny_model_dir)
    before, phi = backbone_of(teacher), phi_of(teacher)
    student = deserialize(student_export["payload"])
    assert teacher.follow_student(3, student_export) == {"version": 3, "corrupt": []}
    after = backbone_of(teacher)
    assert set(after) <= set(student) and "model.layers.0.self_attn.q_proj.weight" in after
    for name, value in after.items():
        torch.testing.assert_close(value, before[name] + rate * (student[name] - before[name]), atol=1e-6, rtol=0)
    assert all(torch.equal(v, phi[k]) for k, v in phi_of(teacher).items())  # the composer is not touched
    teacher.follow_student(3, student_export)  # the same version again (a resumed run's first sync): no change
    assert all(torch.equal(v, after[n]) for n, v in backbone_of(teacher).items())
    broken = dict(student_export, checksums={**student_export["checksums"], "lm_head.weight": "0"})
    assert teacher.follow_student(4, broken)["corrupt"] == ["lm_head.weight"]


def test_a_live_teacher_with_follow_every_takes_a_hard_copy_every_n_steps(tiny_model_dir, student_export):
    from lopd_ray.teacher.worker import TeacherWorker

    cfg = load_config(os.path.join(REPO, "recipes", "opsd_letters_cpu.yaml"),
                      ["teacher.weights=live", "teacher.follow_every=2", "algorithm.distill.support=teacher_topm"])
    teacher = TeacherWorker(cfg, tiny_model_dir)
    before, student = backbone_of(teacher), deserialize(student_export["payload"])
    teacher.follow_student(1, student_export)
    assert all(torch.equal(v, before[n]) for n, v in backbone_of(teacher).items())  # not a copy step
    teacher.follow_student(2, student_export)
    after = backbone_of(teacher)
    assert "model.layers.0.mlp.up_proj.weight" in after
    assert all(torch.equal(v, student[n]) for n, v in after.items())


def test_a_dual_teacher_steps_toward_the_updated_student_and_a_frozen_one_cannot(tiny_model_dir, tmp_path):
    """...and one restored from its checkpoint (backbone and optimizer) takes the same next step."""
    import numpy as np

    from lopd_ray.teacher.contexts import make_context
    from lopd_ray.teacher.worker import TeacherWorker

    recipe = os.path.join(REPO, "recipes", "dualopsd_letters_cpu.yaml")
    frozen = TeacherWorker(load_config(recipe, ["teacher.weights=frozen"]), tiny_model_dir)
    assert frozen.step_engine is None and not any(p.requires_grad for p in frozen._backbone_parameters().values())
    cfg = load_config(recipe, ["teacher.lr=1e-2"])
    teacher = TeacherWorker(cfg, tiny_model_dir)
    trajs = trajectories(teacher.tokenizer, teacher.tasks)
    make_context(cfg, teacher.tasks).attach(trajs, step=0)
    for t, (ids, logp, sampled) in zip(trajs, teacher.score(trajs)):
        t.teacher_topm_ids, t.teacher_topm_logprobs, t.teacher_logprobs = ids, logp, sampled
        t.student_topm_logprobs = np.full(ids.shape, np.log(0.5 / ids.shape[1]), dtype=np.float32)  # flat student
    before = backbone_of(teacher)
    divergences = [teacher.step_toward_student(trajs)["teacher/step_divergence"] for _ in range(3)]
    assert divergences[2] < divergences[1] < divergences[0]  # the teacher moves toward the student
    assert any(not torch.equal(v, before[n]) for n, v in backbone_of(teacher).items())
    teacher.save_checkpoint(str(tmp_path))
    restored = TeacherWorker(cfg, tiny_model_dir)
    restored.load_checkpoint(str(tmp_path))
    assert teacher.step_toward_student(trajs) == restored.step_toward_student(trajs)
    assert all(torch.equal(v, backbone_of(teacher)[n]) for n, v in backbone_of(restored).items())


def test_a_teacher_that_learns_from_successes_raises_their_likelihood_and_ignores_failures(tiny_model_dir, tmp_path):
    """CONTRIBUTING.md's second worked example (teacher.weights=learn_successes): each step lowers the successes'
    NLL under the teacher's context; a batch without a success leaves the backbone as it was; a teacher restored
    from its checkpoint takes the same next step."""
    from lopd_ray.teacher.contexts import make_context
    from lopd_ray.teacher.worker import TeacherWorker

    cfg = load_config(os.path.join(REPO, "recipes", "stsd_letters_cpu.yaml"), ["teacher.lr=1e-2"])
    teacher = TeacherWorker(cfg, tiny_model_dir)
    trajs = trajectories(teacher.tokenizer, teacher.tasks)
    make_context(cfg, teacher.tasks).attach(trajs, step=0)
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)  # every other one a success
    before = backbone_of(teacher)
    failures = [t for t in trajs if t.reward < 1.0]
    assert teacher.learn_successes(failures)["teacher/success_tokens"] == 0.0
    assert all(torch.equal(v, before[n]) for n, v in backbone_of(teacher).items())
    steps = [teacher.learn_successes(trajs) for _ in range(3)]
    assert steps[0]["teacher/success_tokens"] == sum(t.num_action_tokens for t in trajs if t.reward == 1.0)
    assert steps[2]["teacher/success_nll"] < steps[1]["teacher/success_nll"] < steps[0]["teacher/success_nll"]
    teacher.save_checkpoint(str(tmp_path))
    restored = TeacherWorker(cfg, tiny_model_dir)
    restored.load_checkpoint(str(tmp_path))
    assert teacher.learn_successes(trajs) == restored.learn_successes(trajs)


def dual_step_inputs(teacher) -> list[Trajectory]:
    """The trajectories scored by this teacher with their contexts, and a flat student on its top-M."""
    from lopd_ray.teacher.contexts import make_context

    trajs = trajectories(teacher.tokenizer, teacher.tasks)
    make_context(teacher.cfg, teacher.tasks).attach(trajs, step=0)
    for t, (ids, logp, sampled) in zip(trajs, teacher.score(trajs)):
        t.teacher_topm_ids, t.teacher_topm_logprobs, t.teacher_logprobs = ids, logp, sampled
        t.student_topm_logprobs = np.full(ids.shape, np.log(0.5 / ids.shape[1]), dtype=np.float32)
    return trajs


def backbone_moments(teacher) -> list[torch.Tensor]:
    optimizer = teacher.step_engine.optimizer
    return [getattr(optimizer, "optimizer", optimizer).state[p]["exp_avg"].clone()
            for p in teacher._backbone_parameters().values()]


@pytest.mark.ray
def test_two_dual_teacher_ranks_take_the_same_steps_as_one(ray_cluster, tiny_model_dir):
    """The dual teacher steps through the train engine: split over two ranks (unevenly, then one with nothing),
    its gradient is the whole batch's (norm before clipping, Adam's moments) and its divergence the same."""
    recipe = os.path.join(REPO, "recipes", "dualopsd_letters_cpu.yaml")
    one, two = (build_teachers(load_config(recipe, ["teacher.lr=1e-3", f"teacher.num_workers={n}"]), tiny_model_dir)
                for n in (1, 2))
    try:
        trajs = ray.get(one[0].__ray_call__.remote(dual_step_inputs))
        for split in (2, 5):
            single = ray.get(one[0].step_toward_student.remote(trajs))
            double = ray.get([t.step_toward_student.remote(p) for t, p in zip(two, (trajs[:split], trajs[split:]))])
            assert double[0]["teacher/step_divergence"] == double[1]["teacher/step_divergence"]
            for key, value in single.items():
                assert double[0][key] == pytest.approx(value, rel=1e-4), (split, key)
            if split == 2:
                moments = ray.get(one[0].__ray_call__.remote(backbone_moments))
                for moments_rank in ray.get([t.__ray_call__.remote(backbone_moments) for t in two]):
                    for a, b in zip(moments, moments_rank, strict=True):
                        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-3)
    finally:
        one.release()
        two.release()


EXPECTED_AFTER_SYNC = {"frozen": lambda before, student: before, "live": lambda before, student: student,
                       "ema": lambda before, student: before + 0.25 * (student - before),
                       "dual": lambda before, student: before, "learn_successes": lambda before, student: before}


@pytest.mark.parametrize("policy", sorted(EXPECTED_AFTER_SYNC))
def test_every_teacher_weight_policy_keeps_its_contract(policy, tiny_model_dir, student_export):
    """After a sync each policy's backbone is what it promises; only a policy that steps has trainable weights; the
    scores stay finite and a second teacher given the same inputs agrees exactly."""
    import numpy as np

    from lopd_ray.teacher.contexts import make_context
    from lopd_ray.teacher.weights import TEACHER_WEIGHTS, weight_steps
    from lopd_ray.teacher.worker import TeacherWorker

    assert set(EXPECTED_AFTER_SYNC) == set(TEACHER_WEIGHTS)
    cfg = load_config(os.path.join(REPO, "recipes", "opsd_letters_cpu.yaml"),
                      [f"teacher.weights={policy}", "teacher.ema_rate=0.25", "algorithm.distill.support=teacher_topm"])
    teachers = [TeacherWorker(cfg, tiny_model_dir) for _ in range(2)]
    before, student = backbone_of(teachers[0]), deserialize(student_export["payload"])
    trainable = any(p.requires_grad for p in teachers[0]._backbone_parameters().values())
    assert trainable == bool(weight_steps(cfg.teacher))
    results = []
    for teacher in teachers:
        teacher.follow_student(1, student_export)
        for name, value in backbone_of(teacher).items():
            torch.testing.assert_close(value, EXPECTED_AFTER_SYNC[policy](before[name], student[name]), atol=1e-6,
                                       rtol=0)
        trajs = trajectories(teacher.tokenizer, teacher.tasks)
        make_context(cfg, teacher.tasks).attach(trajs, step=0)
        results.append(teacher.score(trajs))
    for one, two in zip(*results):
        assert all(np.isfinite(x).all() for x in one[1:])
        assert all(np.array_equal(a, b) for a, b in zip(one, two))


class RankStandIn:
    """A teacher rank reduced to the one call under test."""

    def __init__(self, tag: str):
        self.tag = tag

    def update_composer(self, trajs):
        return {"tag": self.tag, "trajectories": len(trajs)}


def test_a_step_begun_before_the_group_was_rebuilt_runs_on_the_rebuilt_group(ray_cluster):
    """The composer step runs while the weights sync; a sync that finds a rank dead rebuilds the group, and the step
    then goes to the new group, without a second rebuild."""
    from conftest import kill

    from lopd_ray.teacher.group import TeacherGroup
    from lopd_ray.utils.actor_group import ActorGroup, Restart

    def rebuild():
        teachers.release()
        teachers[:] = [ray.remote(num_cpus=0)(RankStandIn).remote("new")]
    teachers = ActorGroup("TeacherWorker", [ray.remote(num_cpus=0)(RankStandIn).remote("old")], timeout_s=120,
                          restart=Restart("group", rebuild, 1, "teacher.max_restarts"))
    group = TeacherGroup(teacher_cfg(), None, teachers, None)
    trajs = [Trajectory("t", 0, [1], [2, 3], [1, 1], [(0, 2)], [0.0, 0.0], 0) for _ in range(3)]
    try:
        finish = group.start("update_composer", trajs)
        kill(teachers[0])
        teachers.surviving("weight sync", lambda: ray.get(teachers[0].__ray_ready__.remote()), teachers.holds)
        assert [answer for _, answer, _ in finish()] == [{"tag": "new", "trajectories": 3}]
        assert group.restarts == 1
    finally:
        teachers.release()
