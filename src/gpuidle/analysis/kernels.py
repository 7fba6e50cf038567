"""Facts about the kernels and host calls of a rank, inside the analysis window."""

from __future__ import annotations

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.hostwork import thread_axis
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import StepWindow
from gpuidle.model import I64, CopyKind, DeviceOpKind, HostKind, KernelFacts, KernelStat, Timeline
from gpuidle.model.arrays import median_of

SHORT_KERNEL_NS = 10_000
TOP_KERNELS = 10


def kernel_facts(tl: Timeline, names: NameClasses, window: StepWindow, launchers: I64) -> KernelFacts:
    ops, host = tl.device_ops, tl.host
    in_window = (ops.start >= window.start) & (ops.start < window.end)
    kern = in_window & (ops.kind == DeviceOpKind.KERNEL)
    dur = (ops.end - ops.start)[kern]
    kname = ops.name[kern]
    total = int(dur.sum())
    short = dur < SHORT_KERNEL_NS
    gemm_like = names.gemm[kname] | names.conv[kname]
    gemm_time = int(dur[gemm_like].sum())
    reduced = int(dur[gemm_like & names.reduced_precision[kname]].sum())

    top: list[KernelStat] = []
    if kname.size:
        uniq, inv = np.unique(kname, return_inverse=True)
        per_name = np.bincount(inv, weights=dur)
        counts = np.bincount(inv)
        for i in np.argsort(-per_name)[:TOP_KERNELS]:
            top.append(KernelStat(name=tl.strings[int(uniq[i])], count=int(counts[i]),
                                  total_s=float(per_name[i]) / 1e9,
                                  share=float(per_name[i]) / total if total else 0.0))

    h_in = (host.start >= window.start) & (host.start < window.end)
    n_steps = max(len(window.steps), 1)
    syncs = int((h_in & (host.kind == HostKind.RUNTIME) & names.sync_call[host.name]).sum())
    items = int((h_in & (host.kind == HostKind.OP) & (host.name == _id(tl, "aten::item"))).sum())
    pageable = in_window & (ops.copy_kind == CopyKind.HTOD_PAGEABLE)
    any_pageable = in_window & np.isin(ops.copy_kind, (CopyKind.HTOD_PAGEABLE, CopyKind.DTOH_PAGEABLE))
    beside = iv.union(ops.start[kern], ops.end[kern])
    copies = iv.union(ops.start[any_pageable], ops.end[any_pageable])
    exposed_copy_ns = iv.total(copies) - iv.total(iv.intersect(copies, beside))
    sized = any_pageable & (ops.nbytes > 0)
    sized_ns = int((ops.end - ops.start)[sized].sum())
    copy_gbps = float(ops.nbytes[sized].sum()) / sized_ns if sized_ns > 0 else None
    launches = h_in & (host.kind == HostKind.RUNTIME) & names.launch_call[host.name]
    launch_dur = (host.end - host.start)[launches]
    cast = _casts(tl, launchers, np.flatnonzero(kern))
    return KernelFacts(
        cast_kernel_count=int(cast.sum()), cast_kernel_s=float(dur[cast].sum()) / 1e9,
        count=int(kern.sum()),
        total_s=total / 1e9,
        short_kernel_share=float(dur[short].sum()) / total if total else 0.0,
        short_kernel_count=int(short.sum()),
        reduced_precision_gemm_share=(reduced / gemm_time) if gemm_time else None,
        gemm_share=gemm_time / total if total else 0.0,
        conv_share=float(dur[names.conv[kname]].sum()) / total if total else 0.0,
        top=top,
        syncs_per_step=syncs / n_steps,
        item_calls_per_step=items / n_steps,
        pageable_htod_copies=int(pageable.sum()),
        pageable_htod_bytes=int(np.maximum(ops.nbytes[pageable], 0).sum()),
        median_launch_us=float(median_of(launch_dur)) / 1e3 if launch_dur.size else None,
        pageable_copy_s=exposed_copy_ns / 1e9,
        pageable_copy_gbps=round(copy_gbps, 2) if copy_gbps is not None else None,
    )


CAST_OPS = frozenset({"aten::_to_copy", "aten::to", "aten::_autocast_to_reduced_precision",
                      "aten::_autocast_to_full_precision"})
"""Operators that convert a tensor's dtype: a kernel launched inside one is a cast (autocast's re-casts of fp32
weights and activations to 16 bits at each use among them)."""


def _casts(tl: Timeline, launchers: I64, kernels: I64) -> np.ndarray:
    """For each of ``kernels``, whether its launch lies inside a dtype-converting operator on its own thread."""
    host = tl.host
    inside = np.zeros(kernels.size, dtype=bool)
    ids = [i for i, s in enumerate(tl.strings) if s in CAST_OPS]
    calls = launchers[kernels]
    linked = calls >= 0
    if not ids or not linked.any():
        return inside
    on_axis = thread_axis(host)
    rows = np.flatnonzero((host.kind == HostKind.OP) & np.isin(host.name, ids))
    casts = iv.union(on_axis(rows, host.start[rows]), on_axis(rows, host.end[rows]))
    at = calls[linked]
    inside[linked] = iv.covered(casts, on_axis(at, host.start[at]))
    return inside


def _id(tl: Timeline, name: str) -> int:
    try:
        return tl.strings.index(name)
    except ValueError:
        return -1
