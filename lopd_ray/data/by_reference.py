"""The wide per-token arrays ([R, M] supports and log-probs, [R, d] hidden states) travel from the actor that makes
them to the actors that use them by object reference, never through the driver.

An actor that makes them returns two values (`@ray.method(num_returns=2)`): what the driver reads (the [R] arrays,
metrics) and a blob {uid: {field: array}} that the driver never fetches. The driver appends the blob's reference to
each of its trajectories (`Trajectory.array_refs`); a reference inside an argument travels as a reference, and the
actor that needs the arrays fetches them (`fetch_arrays`: on the same node a zero-copy read of shared memory). The
blob is a return value, so the driver owns it: it outlives the actor that made it, and it is freed with the step's
trajectories."""
from __future__ import annotations

import dataclasses

import numpy as np

from lopd_ray.data.trajectory import TOKEN_ARRAYS, Trajectory

# The fields that only actors hold; the driver sees them as None.
BY_REFERENCE = ("support_ids", "teacher_topm_ids", "teacher_topm_logprobs", "teacher_hidden", "student_topm_logprobs",
                "level_topm_ids", "level_topm_logprobs")

Blob = dict[int, dict[str, np.ndarray]]


def make_blob(by_uid: dict[int, dict[str, np.ndarray]]) -> Blob:
    """A blob of per-trajectory fields, keyed by uid (trajectories with no fields left out)."""
    unknown = {name for fields in by_uid.values() for name in fields} - set(BY_REFERENCE)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not fields that travel by reference ({BY_REFERENCE})")
    return {uid: fields for uid, fields in by_uid.items() if fields}


def attach_ref(trajs: list[Trajectory], ref) -> None:
    """Driver side: the trajectories' arrays made by one call are in the blob `ref`."""
    for t in trajs:
        t.array_refs.append(ref)


def fetch_arrays(trajs: list[Trajectory]) -> None:
    """Actor side: sets the by-reference fields of `trajs` from the blobs their `array_refs` name (each blob
    fetched once; a later blob's field replaces an earlier one's)."""
    import ray

    refs = list({ref.hex(): ref for t in trajs for ref in t.array_refs}.values())
    if not refs:
        return
    blobs = dict(zip((ref.hex() for ref in refs), ray.get(refs)))
    for t in trajs:
        for ref in t.array_refs:
            for name, value in blobs[ref.hex()].get(t.uid, {}).items():
                setattr(t, name, value)


def views_with(trajs: list[Trajectory], token_fields: tuple[str, ...]) -> list[Trajectory]:
    """What the driver ships to an actor that reads only `token_fields` of the [R] arrays: views of `trajs`
    without the others (the metadata and the blob references kept)."""
    dropped = {name: None for name in TOKEN_ARRAYS if name not in token_fields and name not in BY_REFERENCE}
    return [dataclasses.replace(t, **dropped) for t in trajs]
