"""How each method's teacher frames one solved example (a problem and its solution): the context it would place in
the prompt, with the wording and placement of the method's context provider (the config's defaults or the run's).

The warm start of `builtin:tiny-qwen3-rules` and the study's gate use these, so that the model is trained and
measured on exactly the contexts the teachers see. An empty solution gives the method's framing with nothing in it.
"""
from __future__ import annotations

from typing import Callable

from lopd_ray.bank.traces import composer_input_text_of, observation_lite_trace
from lopd_ray.data.trajectory import TeacherContext


def seeded_trace(solution: str, bank_cfg) -> str:
    """A solution as the bank stores a seeded reference: one "Action:" line."""
    return observation_lite_trace([(solution, "")], bank_cfg.max_observation_chars, bank_cfg.max_trace_chars)


def lopd_text(cfg, problem: str, solution: str) -> TeacherContext:
    """LOPD's framing around the text its composer reads (the latents' source written out)."""
    c = cfg.composer
    body = composer_input_text_of(problem, seeded_trace(solution, cfg.bank)) if solution else ""
    return TeacherContext(c.framing_before + body + c.framing_after, "user_prefix")


def opsd(cfg, problem: str, solution: str) -> TeacherContext:
    own = cfg.context.oracle
    return TeacherContext(own.framing.format(solution=solution), own.placement)


def op2sd(cfg, problem: str, solution: str) -> TeacherContext:
    own = cfg.context.other_problem
    return TeacherContext(own.framing.format(problem=problem, solution=solution), own.placement)


def sdpo(cfg, problem: str, solution: str) -> TeacherContext:
    own = cfg.context.sibling
    return TeacherContext(own.solution_framing.format(solution=solution) + own.closing, own.placement)


FRAMINGS: dict[str, Callable[..., TeacherContext]] = {"lopd_text": lopd_text, "opsd": opsd, "op2sd": op2sd,
                                                     "sdpo": sdpo}
