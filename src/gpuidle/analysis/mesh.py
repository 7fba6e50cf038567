"""Which parallel dimension each collective belongs to, and the communication idle of each dimension.

A collective's process group is told by its description in the trace's ``distributedInfo.pg_config``, as
PyTorch's ``DeviceMesh`` names its groups (``mesh_tp``, ``mesh_dp_shard_cp``) and Megatron-Core its own
(``TENSOR_MODEL_PARALLEL_GROUP``, ``EXPERT_MODEL_PARALLEL_GROUP``). Where the trace does not say, what the
collective does is the evidence, and the dimension says it was inferred: send/recv is a pipeline's exchange,
all-to-all an expert dispatch, a group of the whole world data parallel when nothing else is."""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.comm import Collectives, split_by_key
from gpuidle.analysis.hostwork import innermost
from gpuidle.analysis.idle import DeviceIdle
from gpuidle.analysis.stack import libraries
from gpuidle.model import I64, Timeline
from gpuidle.model.arrays import median_of
from gpuidle.model.comm_kernels import canonical_op
from gpuidle.model.mesh import DIMENSIONS, SHAPE, MeshDim

_MEGATRON = [(re.compile(p), dim) for p, dim in (
    (r"EXPERT_MODEL|EXPERT_TENSOR_AND_MODEL", "ep"),
    (r"EXPERT_TENSOR", "tp"),
    (r"EXPERT_DATA|DATA_PARALLEL|TENSOR_AND_DATA", "dp"),
    (r"TENSOR_AND_CONTEXT|TENSOR_MODEL", "tp"),
    (r"CONTEXT", "cp"),
    (r"PIPELINE|EMBEDDING", "pp"),
)]
"""Megatron-Core's ``group_desc`` words (``parallel_state.initialize_model_parallel``), first match wins."""
_MESH_WORDS = [({"dp", "fsdp", "ddp", "hsdp", "replicate", "shard", "data", "batch"}, "dp"),
               ({"cp", "context"}, "cp"), ({"ep", "expert", "moe"}, "ep"), ({"tp", "tensor"}, "tp"),
               ({"pp", "pipeline", "stage"}, "pp")]
"""Words of a ``DeviceMesh`` dimension's name (``mesh_<name>``: torchtitan's ``dp_replicate``, ``dp_shard``,
``cp``, ``tp``, ``pp``, ``ep``, the flattened ``dp_shard_cp``); first match wins, so data parallel flattened
with context parallel stays data parallel (it reduces gradients)."""
WORLD_DESCRIPTIONS = ("default_pg", "mesh_default")


@functools.lru_cache(maxsize=256)
def dimension_of_group(desc: str) -> str | None:
    """``tp`` for ``mesh_tp`` or ``TENSOR_MODEL_PARALLEL_GROUP``; ``world`` for the default group; None where the
    description names no dimension (``undefined``, ``mesh_dim_0``)."""
    if desc in WORLD_DESCRIPTIONS:
        return "world"
    for pattern, dim in _MEGATRON:
        if pattern.search(desc):
            return dim
    if desc.startswith("mesh_"):
        words = set(desc[len("mesh_"):].lower().split("_"))
        for names, dim in _MESH_WORDS:
            if words & names:
                return dim
    return None


def group_dimensions(desc: str) -> frozenset[str]:
    """Every dimension a group's description names: one for most, two for a flattened group (torchtitan's
    ``mesh_dp_shard_cp``, Megatron-Core's ``DATA_PARALLEL_GROUP_WITH_CP``, ``TENSOR_AND_CONTEXT_PARALLEL_GROUP``),
    whose size and place are no single dimension's. Megatron-Core's expert groups
    (``EXPERT_DATA_PARALLEL_GROUP``, ``EXPERT_TENSOR_PARALLEL_GROUP``) name ``ep`` beside their own dimension: they
    split the expert layers' ranks, not the dense layers', so an 8-rank job's ``DATA_PARALLEL_GROUP`` of 8 and
    ``EXPERT_DATA_PARALLEL_GROUP`` of 2 is data parallel 8, never 16."""
    if desc.startswith("mesh_"):
        words = set(desc[len("mesh_"):].lower().split("_"))
        return frozenset(dim for names, dim in _MESH_WORDS if words & names)
    named = set()
    if "EXPERT" in desc:  # the expert layers' own mesh (ep × expert tp × expert dp): no dense dimension's size
        named.add("ep")
    for word, dim in (("TENSOR", "tp"), ("DATA", "dp"), ("CONTEXT", "cp"), ("_WITH_CP", "cp"), ("PIPELINE", "pp"),
                      ("EMBEDDING", "pp")):
        if word in desc:
            named.add(dim)
    return frozenset(named)


class _Group:
    """One process group as ``pg_config`` records it; ``ranks`` may be empty for a group of the whole world (as
    some PyTorch versions write it, and the tracker keeps it)."""

    def __init__(self, fact: dict[str, Any]) -> None:
        self.desc = str(fact.get("pg_desc", ""))
        ranks = fact.get("ranks")
        self.ranks = [int(r) for r in ranks if isinstance(r, int) and not isinstance(r, bool)] \
            if isinstance(ranks, list) else []
        size = fact.get("pg_size", fact.get("group_size"))
        self.size = len(self.ranks) or (size if isinstance(size, int) and not isinstance(size, bool) and size > 0
                                        else 0)

    def place(self, rank: int | None) -> int | None:
        """``rank``'s index in the group; a whole-world group without its ranks holds every rank in order."""
        if rank is None:
            return None
        if self.ranks:
            return self.ranks.index(rank) if rank in self.ranks else None
        return rank if 0 <= rank < self.size else None


def _place(facts: dict[str, _Group], dim: str, rank: int | None, fallback: _Group | None,
           world: int | None) -> tuple[int | None, int | None, list[int]]:
    """``(size, coordinate, ranks)`` of ``rank`` in ``dim``: from this rank's groups that name ``dim`` alone (two
    of them, as HSDP's ``dp_replicate`` and ``dp_shard``, multiply: outer first); else from ``fallback``, the
    group its collectives ran on. ``ranks`` only for one group smaller than the world (a world-long list per
    rank would grow with the square of the job)."""
    single = [g for g in facts.values() if group_dimensions(g.desc) == {dim} and g.size
              and (rank is None or g.place(rank) is not None)]
    distinct = list({g.desc: g for g in single}.values())
    if not distinct and fallback is not None and fallback.size:
        distinct = [fallback]
    if not distinct:
        return None, None, []
    size = 1
    coordinate: int | None = 0
    for g in distinct:
        place = g.place(rank)
        size *= g.size
        coordinate = coordinate * g.size + place if place is not None and coordinate is not None else None
    ranks = distinct[0].ranks if len(distinct) == 1 and (world is None or distinct[0].size < world) else []
    return size, coordinate, ranks


def groups_by_name(groups: list[dict[str, Any]]) -> dict[str, _Group]:
    """The rank's process groups (``pg_config`` entries) by name, each read once."""
    return {str(g.get("pg_name", "")): _Group(g) for g in groups}


def collective_dimensions(facts: dict[str, _Group], world: int | None, kinds: list[str], groups: list[str],
                          sizes: I64, moe: bool) -> list[tuple[str, str]]:
    """``(dimension, source)`` for each collective (its canonical kind, group name and group size), ``facts``
    the rank's groups (:func:`groups_by_name`); ``moe``: the trace names a mixture-of-experts model
    (:func:`mixture_of_experts`)."""
    out = []
    for kind, name, size in zip(kinds, groups, sizes.tolist(), strict=True):
        fact = facts.get(name)
        dim = dimension_of_group(fact.desc) if fact is not None else None
        if dim is not None and fact is not None:
            out.append((dim, f"group '{fact.desc}'" + (" (the whole world)" if dim == "world" else "")))
        elif kind == "send_recv":
            out.append(("pp", "inferred from send/recv (pipeline stages pass activations)"))
        elif kind == "all_to_all" and moe:
            out.append(("ep", "inferred from all-to-all in a mixture-of-experts model (expert dispatch and combine)"))
        elif kind == "all_to_all":
            out.append(("unknown", "all-to-all, its group not recorded: expert dispatch, sharded embeddings or "
                                   "sequence-parallel attention"))
        elif world is not None and (size == world or (fact is not None and fact.size == world)):
            out.append(("world", "inferred: its group is the whole world"))
        else:
            out.append(("unknown", "the trace records no group description"))
    return out


def _world_is_data_parallel(dims: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """In a job with no dimension but the whole world, the world is data parallel: inferred, with the evidence."""
    return [("dp", f"inferred: {source.removeprefix('inferred: ')}, and no other dimension") if dim == "world"
            else (dim, source) for dim, source in dims]


def mixture_of_experts(tl: Timeline) -> bool:
    """The trace names a mixture-of-experts layer, router or kernel anywhere."""
    return "moe" in libraries(tl)


DimSegments = tuple[I64, I64, I64, np.ndarray]
"""The ``communication`` idle segments, cut at every collective's ends and at the steps' bounds: ``(start, end,
step index, dimension)`` (the dimension as a string per segment)."""


def mesh_dims(tl: Timeline, coll: Collectives, device: DeviceIdle, bounds: I64,
              under: tuple[I64, I64, I64]) -> tuple[list[MeshDim], list[dict[str, float]], DimSegments]:
    """The rank's dimensions (in :data:`DIMENSIONS` order) and, per step, its ``communication`` idle by
    dimension: under the collective kernel running then, else under the collective call the host was in, else
    ``unknown``; ``under``: that idle's segments with their collective (:func:`collective_under`). The
    dimensions' idle adds up to the cause's, step by step."""
    calls = tl.collectives
    call_kinds = [canonical_op(c) for c in calls.collective]
    moe = "all_to_all" in {*call_kinds, *coll.collective} and mixture_of_experts(tl)  # the names read only if asked
    facts = groups_by_name(tl.meta.process_groups)
    world = tl.meta.world_size
    call_dims = collective_dimensions(facts, world, call_kinds, calls.process_group,
                                      calls.group_size.astype(np.int64), moe)
    kernel_dims = collective_dimensions(facts, world, coll.collective, coll.process_group,
                                        coll.group_size.astype(np.int64), moe)
    one_group = (bool(kernel_dims) and not any(d in SHAPE for d, _ in kernel_dims + call_dims)
                 and {d for d, _ in kernel_dims} == {"world"})
    if not any(d in SHAPE for d, _ in kernel_dims + call_dims):
        kernel_dims, call_dims = _world_is_data_parallel(kernel_dims), _world_is_data_parallel(call_dims)
    if one_group:  # every kernel's group is the whole world: so is a call's that records none
        call_dims = [("dp", "inferred: its group not recorded, every kernel's is the whole world") if d == "unknown"
                     else (d, source) for d, source in call_dims]
    s, e, row = under
    keys = [*(d for d, _ in kernel_dims), *(d for d, _ in call_dims), "unknown"]
    key_row = row.copy()
    loose = np.flatnonzero(row < 0)
    key_row[loose] = len(keys) - 1
    grouped = np.array([bool(g) for g in calls.process_group], dtype=bool)
    # the call the host was in: one that names its group first (record_param_comms around an nccl:* range)
    for rows in (np.flatnonzero(grouped), np.arange(len(calls))):
        if loose.size == 0 or rows.size == 0:
            continue
        host_row = innermost(tl.host.start, tl.host.end, calls.host_index[rows], s[loose])
        call_of = {int(h): int(i) for i, h in zip(rows.tolist(), calls.host_index[rows].tolist(), strict=True)}
        found = host_row >= 0
        key_row[loose[found]] = [len(kernel_dims) + call_of[int(h)] for h in host_row[found].tolist()]
        loose = loose[~found]
    if one_group:
        keys[-1] = "dp"
    per_step = split_by_key(s, e, key_row, keys, bounds)
    exposed: dict[str, float] = {}
    for d in per_step:
        for k, v in d.items():
            exposed[k] = exposed.get(k, 0.0) + v
    step = np.clip(np.searchsorted(bounds, s, side="right") - 1, 0, bounds.size - 2)
    labelled = (s, e, step, np.array(keys, dtype=object)[key_row] if key_row.size else np.zeros(0, dtype=object))
    return _dims(tl, facts, coll, device, kernel_dims, call_dims, exposed, call_kinds), per_step, labelled


def _declared(facts: dict[str, _Group], rank: int | None) -> dict[str, str]:
    """Dimension -> the first group of this rank whose description names it."""
    declared: dict[str, str] = {}
    for name, fact in facts.items():
        dim = dimension_of_group(fact.desc)
        if dim in SHAPE and (rank is None or fact.place(rank) is not None):
            declared.setdefault(dim, name)
    return declared


def tracker_mesh(groups: list[dict[str, Any]], rank: int, world: int, comm_s: float, exposed_s: float,
                 collectives: int) -> list[MeshDim]:
    """The mesh a step tracker's rank shows: its groups' dimensions with its place in each; the communication it
    timed (DDP's, FSDP's or DeepSpeed's hooks, ``collectives`` buckets) is data parallel's."""
    facts = groups_by_name(groups)
    declared = _declared(facts, rank)
    out = []
    for dim in (d for d in SHAPE if d in declared or (d == "dp" and comm_s > 0)):
        fact = facts.get(declared.get(dim, ""))
        size, coordinate, ranks = _place(facts, dim, rank, fact, world)
        out.append(MeshDim(
            dim=dim, size=size, coordinate=coordinate, groups=[declared[dim]] if fact else [],
            source=f"group '{fact.desc}'" if fact is not None else "the tracker's data-parallel hooks",
            count=collectives if dim == "dp" else 0, comm_s=comm_s if dim == "dp" else 0.0,
            exposed_s=exposed_s if dim == "dp" else 0.0, ranks=ranks,
        ))
    return out


def _dims(tl: Timeline, facts: dict[str, _Group], coll: Collectives, device: DeviceIdle,
          kernel_dims: list[tuple[str, str]], call_dims: list[tuple[str, str]], exposed: dict[str, float],
          call_kinds: list[str]) -> list[MeshDim]:
    """One :class:`MeshDim` per dimension that a collective, a step's idle or one of this rank's process groups
    (``pg_config``, where its description names a dimension) shows; sizes and places from the groups' ranks."""
    rank = tl.meta.rank
    declared = _declared(facts, rank)
    on_device = coll.device == device.device
    kernel_of = np.array([d for d, _ in kernel_dims], dtype=object)
    recorded = [tl.strings[int(tl.host.name[h])] == "record_param_comms" for h in tl.collectives.host_index]
    out = []
    seen = ({d for d, _ in kernel_dims} | {d for d, _ in call_dims} | {k for k, v in exposed.items() if v}
            | set(declared))
    for dim in (d for d in DIMENSIONS if d in seen):
        mine = np.flatnonzero(on_device & (kernel_of == dim)) if kernel_of.size else np.zeros(0, dtype=np.int64)
        named = [coll.process_group[i] for i in mine] + [
            tl.collectives.process_group[i] for i, (d, _) in enumerate(call_dims) if d == dim]
        groups = sorted({g for g in named if g}, key=lambda g: (-named.count(g), g))
        sources = [s for d, s in kernel_dims if d == dim] or [s for d, s in call_dims if d == dim]
        main = facts.get(groups[0] if groups else declared.get(dim, ""))
        if not sources and main is not None:
            sources = [f"group '{main.desc}' (no collective of it in the window)"]
        size, coordinate, ranks = _place(facts, dim, rank, main, tl.meta.world_size)
        sized = coll.group_size[mine][coll.group_size[mine] > 0]
        if size is None and sized.size:
            size = int(median_of(sized))
        out.append(MeshDim(
            dim=dim, size=size if dim in SHAPE else None, coordinate=coordinate if dim in SHAPE else None,
            groups=groups or ([declared[dim]] if dim in declared else []),
            source=max(sorted(set(sources)), key=sources.count) if sources else "no collective ran",
            count=int(mine.size),
            comm_s=iv.total(iv.clip(iv.union(coll.start[mine], coll.end[mine]), *device.window)) / 1e9,
            exposed_s=exposed.get(dim, 0.0), ranks=ranks if dim in SHAPE else [],
            p2p=sum(1 for i, (d, _) in enumerate(call_dims)
                    if d == dim and recorded[i] and call_kinds[i] == "send_recv")
            or sum(1 for i in mine if coll.collective[i] == "send_recv"),
        ))
    return out
