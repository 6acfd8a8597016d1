"""A step's samples as groups (the samples of one prompt), and DAPO's dynamic sampling over them."""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, TypeVar

from lopd_ray.data.trajectory import Trajectory

Group = TypeVar("Group")


def by_group(trajs: list[Trajectory]) -> dict[int, list[Trajectory]]:
    """The samples of each prompt (its group), in order."""
    groups = defaultdict(list)
    for t in trajs:
        groups[t.group_id].append(t)
    return groups


def refill_groups(groups: list[Group], informative: Callable[[Group], bool], roll_more: Callable[[int], list[Group]],
                                needed: int, rounds: int) -> tuple[list[Group], int]:
    """Dynamic sampling: while fewer than `needed` of the `needed` groups are informative, `roll_more(round)` draws
    another round of groups, for at most `rounds` rounds. Returns `needed` groups (the first ones unchanged when no
    round was drawn; else informative ones first, uninformative ones only where the rounds ran out) and the number
    of rounds drawn."""
    useful = [g for g in groups if informative(g)]
    spare = [g for g in groups if not informative(g)]
    drawn = 0
    while len(useful) < needed and drawn < rounds:
        drawn += 1
        for g in roll_more(drawn):
            (useful if informative(g) else spare).append(g)
    return (useful + spare)[:needed] if drawn else groups[:needed], drawn
