"""What kind of program a trace shows: training or inference, eager, compiled or replaying CUDA graphs,
and the serving engine when one is named. The fixes that fit differ for each."""

from __future__ import annotations

import numpy as np

from gpuidle.analysis.names import NameClasses
from gpuidle.model import I64, DeviceOpKind, HostKind, Timeline, Workload
from gpuidle.model.arrays import distinct

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
    both = np.concatenate((named, ops.name))
    engines = {tl.strings[int(i)].lower() for i in distinct(both[names.engine[both]])}
    engine = next((e for e in ("vllm", "sglang") if any(e in n for n in engines)), None)
    return Workload(mode=mode, execution=execution, engine=engine)
