"""Per-token arrays travel between actors by object reference; the driver handles each at most once.

- The wide arrays (the signals declared `by_reference` in data/signals.py: [R, M] supports and log-probs, [R, d]
  hidden states) never pass through the driver. An actor that makes them returns two values
  (`@ray.method(num_returns=2)`, `signals.ship`): what the driver reads (the [R] arrays, metrics) and a blob
  {uid: {field: array}} that the driver never fetches. The driver appends the blob's reference to each of its
  trajectories (`Trajectory.array_refs`).
- The rollout's arrays (ROLLOUT_ARRAYS) stay with the driver, whose metrics, dumps and bank read them, and reach
  the actors from the object the rollout worker returned (`Trajectory.rollout_ref`: that object's reference and
  the trajectory's position in it); what the driver sends to actors (`views_with`) leaves them out.

A reference inside an argument travels as a reference; the actor that needs the arrays fetches them
(`fetch_arrays`: on the same node a zero-copy read of shared memory). A blob is the return value of the call that
made it, so the driver owns it: it outlives the actor that made it and is freed with the step's trajectories."""
from __future__ import annotations

import dataclasses

import numpy as np

from lopd_ray.data.signals import BY_REFERENCE, Rows
from lopd_ray.data.trajectory import TOKEN_ARRAYS, Trajectory

ROLLOUT_ARRAYS = ("prompt_ids", "response_ids", "loss_mask", "rollout_logprobs")


def attach_ref(trajs: list[Trajectory], ref) -> None:
    """Driver side: the trajectories' arrays made by one call are in the blob `ref`."""
    for t in trajs:
        t.array_refs.append(ref)


def fill_rows(trajs: list[Trajectory], rows: Rows) -> None:
    """Driver side: the driver-held signals a scorer answered ({uid: {signal: array}})."""
    for t in trajs:
        for name, value in rows.get(t.uid, {}).items():
            setattr(t, name, value)


def views_with(trajs: list[Trajectory], token_fields: tuple[str, ...]) -> list[Trajectory]:
    """What the driver sends to an actor that reads only `token_fields` of the [R] arrays: views of `trajs`
    without the others, nor the rollout's arrays once shipped (the metadata and the references kept)."""
    def dropped(t: Trajectory) -> dict:
        shipped = ROLLOUT_ARRAYS if t.rollout_ref is not None else ()
        return {name: None for name in TOKEN_ARRAYS
                if name in shipped or (name not in token_fields and name not in BY_REFERENCE)}
    return [dataclasses.replace(t, **dropped(t)) for t in trajs]


def fetch_arrays(trajs: list[Trajectory]) -> None:
    """Actor side: fills the fields that `trajs` lack from the objects they name (each fetched once)."""
    import ray

    refs = {}
    for t in trajs:
        for ref in ([t.rollout_ref[0]] if t.rollout_ref is not None else []) + t.array_refs:
            refs.setdefault(ref.hex(), ref)
    if not refs:
        return
    fetched = dict(zip(refs, ray.get(list(refs.values()))))
    for t in trajs:
        if t.rollout_ref is not None:
            ref, position = t.rollout_ref
            _fill(t, {name: getattr(fetched[ref.hex()][position], name) for name in ROLLOUT_ARRAYS})
        for ref in t.array_refs:
            _fill(t, fetched[ref.hex()].get(t.uid, {}))


def _fill(t: Trajectory, fields: dict) -> None:
    for name, value in fields.items():
        if getattr(t, name) is None:
            setattr(t, name, value)
