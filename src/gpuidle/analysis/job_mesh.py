"""The job's mesh from its ranks': the dimensions merged, the parts of the mesh no trace covers, and the
pipeline stage that sets the pace."""

from __future__ import annotations

import numpy as np

from gpuidle.analysis.steps import counted
from gpuidle.model import RankReport, duration, ranges
from gpuidle.model.arrays import median_of
from gpuidle.model.mesh import DIMENSION_WORDS, DIMENSIONS, SHAPE, MeshDim

PACE_NOISE = 0.05
"""Stages whose compute per step differs by less than this share compute alike: the pace is the schedule's."""
SKEW_SHARE = 0.03
"""Ranks whose exposed all-to-all per step differs by less than this share of the step wait alike."""


def job_mesh(meshes: list[list[MeshDim]]) -> list[MeshDim]:
    """The ranks' dimensions merged: size, source and groups as most ranks show them, counts and times summed."""
    out = []
    for dim in DIMENSIONS:
        mine = [m for mesh in meshes for m in mesh if m.dim == dim]
        if not mine:
            continue
        sizes = [m.size for m in mine if m.size is not None]
        sources = [m.source for m in mine]
        groups = [g for m in mine for g in m.groups]
        out.append(MeshDim(
            dim=dim, size=max(sorted(set(sizes)), key=sizes.count) if sizes else None, coordinate=None,
            groups=sorted(set(groups), key=groups.count, reverse=True), source=max(sorted(set(sources)),
                                                                                  key=sources.count),
            count=sum(m.count for m in mine), comm_s=sum(m.comm_s for m in mine),
            exposed_s=sum(m.exposed_s for m in mine),
        ))
    return out


def mesh_gaps(meshes: list[list[MeshDim]], found: set[int]) -> list[str]:
    """``no trace of pp 1 (ranks 5, 7)``: the places of a dimension that no given rank holds, with the ranks the
    given ranks' groups put there; a job whose ranks are partly missing names which part of its mesh. One line per
    dimension however many places it misses (``no trace of 1,022 ranks, dp 1-511 (ranks 2-1023)``)."""
    placed: dict[str, dict[int, set[int]]] = {}
    for mesh in meshes:
        for m in mesh:
            if m.dim in SHAPE and m.ranks:
                for place, r in enumerate(m.ranks):
                    placed.setdefault(m.dim, {}).setdefault(place, set()).add(r)
    notes = []
    for dim in SHAPE:
        gaps = [(place, ranks) for place, ranks in sorted(placed.get(dim, {}).items()) if not ranks & found]
        if not gaps:
            continue
        ranks = sorted({r for _, held in gaps for r in held})
        if len(gaps) == 1:
            notes.append(f"no trace of {dim} {gaps[0][0]} (ranks {', '.join(map(str, ranks))}): its "
                         f"{DIMENSION_WORDS[dim]} part of the job is not in this analysis")
        else:
            notes.append(f"no trace of {len(ranks):,} ranks, {dim} {ranges([p for p, _ in gaps])} (ranks "
                         f"{ranges(ranks)}): not in this analysis")
    return notes


def pipeline_pace(reports: list[RankReport], include_all: bool = False) -> tuple[list[str], set[int]]:
    """The stage that sets a pipeline's pace: the one whose ranks compute the longest per step (busy time; the
    others wait for it in their bubbles). Its note, and those of its ranks that compute alike their stage's other
    ranks (all of them where it has one): a slow stage is no data-parallel straggler, but a slow GPU within it
    still is."""
    stages: dict[int, list[tuple[int, float]]] = {}
    for r in reports:
        pp = next((m for m in r.communication.mesh if m.dim == "pp"), None)
        steps = counted(r.steps, include_all)
        if pp is not None and pp.coordinate is not None and steps:
            stages.setdefault(pp.coordinate, []).append((r.rank, sum(s.busy_s for s in steps) / len(steps)))
    if len(stages) < 2:
        return [], set()
    busy = {stage: float(np.mean([b for _, b in ranks])) for stage, ranks in stages.items()}
    slow, fast = max(busy, key=lambda k: busy[k]), min(busy, key=lambda k: busy[k])
    if busy[slow] <= busy[fast] * (1 + PACE_NOISE):
        return [f"pipeline stages compute alike ({duration(busy[fast])} to {duration(busy[slow])} a step): the "
                "pace is the schedule's, not one stage's"], set()
    ranks = sorted(r for r, _ in stages[slow])
    alike: set[int] = set()
    for member, own in stages[slow]:
        peers = [other for q, other in stages[slow] if q != member]
        if not peers or own <= float(median_of(peers)) * (1 + PACE_NOISE):
            alike.add(member)
    return [f"pipeline stage {slow} (ranks {', '.join(map(str, ranks))}) computes the longest, "
            f"{duration(busy[slow])} a step against {duration(busy[fast])} on stage {fast}: it sets the pipeline's "
            "pace; move layers off it (a slow stage is no data-parallel straggler)"], alike


def expert_skew(reports: list[RankReport], include_all: bool = False) -> list[str]:
    """The rank the others wait for in their all-to-alls: the one whose own all-to-alls wait least (its
    experts, given the most tokens, or its embedding tables finish last), named where the ranks' exposed all-to-all
    per step differ by :data:`SKEW_SHARE` of the step or more. A fact, not a remedy: the fix for the stack that ran
    (an MoE router's balance, a recommender's sharding plan) is its rule's."""
    waits: dict[int, tuple[float, float]] = {}
    for r in reports:
        steps = counted(r.steps, include_all)
        exposed = sum(v for s in steps for k, v in s.exposed_comm_s.items() if k.startswith("all_to_all:"))
        if steps and exposed > 0:
            waits[r.rank] = (exposed / len(steps), sum(s.dur_s for s in steps) / len(steps))
    if len(waits) < 2:
        return []
    least, most = min(waits, key=lambda k: waits[k][0]), max(waits, key=lambda k: waits[k][0])
    step = float(median_of([st for _, st in waits.values()]))
    if waits[most][0] - waits[least][0] < SKEW_SHARE * step:
        return []
    return [f"all-to-all: rank {least} waits least in its all-to-alls ({duration(waits[least][0])} a step against "
            f"{duration(waits[most][0])} on rank {most}): the others wait for it"]
