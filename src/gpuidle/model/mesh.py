"""The job's parallel mesh as one rank sees it: each dimension, its size, the rank's place in it, and the
communication idle that belongs to it."""

from __future__ import annotations

import msgspec

DIMENSIONS = ("pp", "dp", "cp", "ep", "tp", "world", "unknown")
"""Parallel dimensions, outermost first as Megatron-Core and torchtitan lay them out (pipeline, data, context,
expert, tensor), then collectives on the whole world in a job of several dimensions (a barrier, a logged loss),
then those whose group the trace does not say."""
SHAPE = ("pp", "dp", "cp", "ep", "tp")
"""The dimensions that make up the mesh's shape (``world`` and ``unknown`` are none of them)."""
DIMENSION_WORDS = {"pp": "pipeline parallel", "dp": "data parallel", "cp": "context parallel",
                   "ep": "expert parallel", "tp": "tensor parallel", "world": "the whole world",
                   "unknown": "group not recorded"}


class MeshDim(msgspec.Struct):
    """One parallel dimension of the job from this rank's collectives and process groups."""

    dim: str
    """One of :data:`DIMENSIONS`."""
    size: int | None
    """Ranks in this rank's group of the dimension; None where the trace does not say."""
    coordinate: int | None
    """This rank's place in that group (its index in the group's ranks); None where the ranks are not recorded."""
    groups: list[str]
    """The process groups (names) whose collectives this dimension holds."""
    source: str
    """How the dimension was told: ``group 'mesh_tp'`` (the group's own description), or ``inferred from ...``."""
    count: int
    """Collective kernels of the dimension in the window."""
    comm_s: float
    """Their device time (union)."""
    exposed_s: float
    """The rank's ``communication`` idle while one of them ran, or under one of their host calls: the
    dimensions' ``exposed_s`` add up to that idle (``DeviceReport.idle_by_cause_s["communication"]``)."""
    ranks: list[int] = []
    """This rank's group of the dimension, where recorded and smaller than the world."""
    p2p: int = 0
    """Its send/recv operations in the window: host calls (``record_param_comms``) where the trace records them,
    as a batched send/recv runs as one kernel; else its send/recv kernels."""

    @property
    def inferred(self) -> bool:
        return self.source.startswith("inferred")
