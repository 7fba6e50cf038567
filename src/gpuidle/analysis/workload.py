"""What kind of program a trace shows: training or inference, eager, compiled or replaying CUDA graphs,
and the serving engine when one is named. The fixes that fit differ for each."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.stack import libraries
from gpuidle.model import I64, DeviceOpKind, HostKind, Timeline, Workload

MIN_GRAPH_SHARE = 0.5
"""A step replays CUDA graphs when at least half of its kernels come from graph launches."""


def workload(tl: Timeline, names: NameClasses, launchers: I64) -> Workload | None:
    """None for a trace without host operators (nothing to tell by)."""
    host, ops = tl.host, tl.device_ops
    named = host.name
    if len(host) == 0 or not (host.kind == HostKind.OP).any():
        return None
    mode = "training" if names.training_op[named].any() else "inference"
    kernels = ops.kind == DeviceOpKind.KERNEL
    linked = kernels & (launchers >= 0)
    from_graph = linked.copy()
    from_graph[linked] = names.graph_launch[named[launchers[linked]]]
    if kernels.any() and from_graph.sum() >= MIN_GRAPH_SHARE * kernels.sum():
        execution = "cuda_graphs"
    elif names.compiled[named].any() or names.compiled[ops.name[kernels]].any():
        execution = "compiled"
    else:
        execution = "eager"
    engine = _engine(tl, names, named) or _engine(tl, names, ops.name[kernels])
    return Workload(mode=mode, execution=execution, engine=engine, libraries=libraries(tl))


ENGINES = ("vllm", "sglang")


def _engine(tl: Timeline, names: NameClasses, rows_names: npt.NDArray[np.integer[Any]]) -> str | None:
    """The serving engine these events name most often: the host's events first (the engine's own Python, ranges
    and operators), kernels only where the host names none. One kernel templated on another project's type (an
    SGLang run's ``vllm::`` kernels) names its library, not the engine that runs it."""
    named = rows_names[names.engine[rows_names]]
    if named.size == 0:
        return None
    ids, counts = np.unique(named, return_counts=True)
    votes = dict.fromkeys(ENGINES, 0)
    for i, n in zip(ids.tolist(), counts.tolist(), strict=True):
        lowered = tl.strings[i].lower()
        for e in ENGINES:
            votes[e] += n if e in lowered else 0
    best = max(ENGINES, key=lambda e: votes[e])
    return best if votes[best] > 0 else None
