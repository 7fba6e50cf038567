"""Data-parallel style and the role of each collective: DDP, FSDP2, DeepSpeed ZeRO.

The style comes from the labels the frameworks record around their work:

- FSDP2 (``torch.distributed.fsdp.fully_shard``) opens ``record_function`` ranges named
  ``FSDP::root_pre_forward``, ``FSDP::pre_forward (<module>)``, ``FSDP::all_gather (<module>)``,
  ``FSDP::forward_prefetch for <module>``, ``FSDP::pre_backward (<module>)``,
  ``FSDP::backward_prefetch for <module>``, ``FSDP::post_backward_reduce (<module>)``,
  ``FSDP::post_backward_rs_wait (<module>)`` and ``FSDP::root_post_backward_callback``
  (torch 2.13, ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` and ``_fsdp_state.py``).
- DeepSpeed records NVTX ranges named by the decorated function's ``__qualname__``
  (``instrument_w_nvtx`` in ``deepspeed/utils/nvtx.py``): ``DeepSpeedEngine.forward``,
  ``DeepSpeedEngine.backward``, ``DeepSpeedEngine.allreduce_gradients``; ZeRO-3's
  ``PartitionedParameterCoordinator.fetch_sub_module`` and ``.__all_gather_params``
  (``partitioned_param_coordinator.py``) and ``DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads``
  (``stage3.py``); ZeRO-1/2's optimizer is ``DeepSpeedZeroOptimizer`` (``stage_1_and_2.py``).
  NVTX ranges reach gpuidle through Nsight Systems exports; a PyTorch profiler trace does not record them.
- DDP records ``DistributedDataParallel.forward``; without any label, all-reduces and no parameter
  all-gather or reduce-scatter are taken for DDP's pattern in a training program (its fixes have always
  applied to them), and for tensor parallelism in an inference program.

A collective's phase is the range around its launch on the launching thread: backward inside
``autograd::engine::evaluate_function``, an FSDP backward hook or ``DeepSpeedEngine.backward``, or
launched from a thread other than the one that runs the forward (autograd's device threads);
optimizer inside ``Optimizer.step``; forward otherwise. Its role follows from its type and phase.
"""

from __future__ import annotations

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.comm import Collectives
from gpuidle.analysis.idle import DeviceIdle
from gpuidle.analysis.names import NameClasses
from gpuidle.model import I32, I64, CommRole, HostKind, Timeline

FSDP_PREFIX = "FSDP::"
DS_STAGE3 = ("DeepSpeedZeroOptimizer_Stage3.", "PartitionedParameterCoordinator.")
DS_STAGE12 = "DeepSpeedZeroOptimizer."
DS_ENGINE = "DeepSpeedEngine."
DDP_FORWARD = "DistributedDataParallel.forward"
BACKWARD_MARKS = ("autograd::engine::evaluate_function", "FSDP::pre_backward", "FSDP::backward_prefetch",
                  "FSDP::post_backward", "FSDP::root_post_backward", "DeepSpeedEngine.backward",
                  "DeepSpeedEngine.allreduce_gradients", "DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition")
OPTIMIZER_MARKS = ("Optimizer.step", "DeepSpeedEngine.step", "DeepSpeedZeroOptimizer.step",
                   "DeepSpeedZeroOptimizer_Stage3.step")
FORWARD_MARKS = ("FSDP::root_pre_forward", "FSDP::pre_forward", "DeepSpeedEngine.forward", DDP_FORWARD,
                 "ProfilerStep#")
_MARKS = (FSDP_PREFIX, DS_ENGINE, DS_STAGE12, *DS_STAGE3, DDP_FORWARD, *BACKWARD_MARKS, *OPTIMIZER_MARKS,
          *FORWARD_MARKS)


def parallelism_of(names: set[str]) -> str | None:
    """The style the labels name, or None when no label tells."""
    if any(n.startswith(FSDP_PREFIX) for n in names):
        return "fsdp2"
    if any(n.startswith(DS_STAGE3) for n in names):
        return "deepspeed_zero3"
    if any(n.startswith(DS_STAGE12) for n in names):
        return "deepspeed_zero1_2"
    if any(n.startswith(DS_ENGINE) for n in names):
        return "deepspeed"
    if DDP_FORWARD in names:
        return "ddp"
    return None


def role_of(collective: str, phase: str, parallelism: str) -> str:
    """A collective's role from its type, its phase and the job's style: all-gathers and reduce-scatters
    move parameters and gradients only in a sharded job (elsewhere: embeddings, tensor parallelism)."""
    sharded = parallelism.startswith(("fsdp", "deepspeed"))
    if collective in ("reduce_scatter", "all_gather") and not sharded:
        return "other"
    if collective == "reduce_scatter":
        return "grad_reduce_scatter"
    if collective == "all_gather":
        return {"forward": "param_all_gather_forward", "backward": "param_all_gather_backward",
                "optimizer": "param_all_gather_optimizer"}.get(phase, "other")
    if collective == "all_reduce" and phase == "backward":
        return "replicate_all_reduce" if parallelism == "fsdp2" else "grad_all_reduce"
    return "other"


def classify(tl: Timeline, names: NameClasses, coll: Collectives, launchers: I64,
             training: bool) -> tuple[str, list[str]]:
    """The job's style and each collective's role; ``training``: the program runs a backward pass. Names are
    tested once per shape (:meth:`NameClasses.matching`'s): a profile's many ``ProfilerStep#N`` are one."""
    host = tl.host

    def named(marks: tuple[str, ...]) -> np.ndarray:
        found: np.ndarray = np.array([s.startswith(marks) for s in names.shaped], dtype=bool)[names.shape]
        return found

    marked = named(_MARKS)
    rows = np.flatnonzero(marked[host.name] & (host.kind != HostKind.RUNTIME)) if marked.size else \
        np.zeros(0, dtype=np.int64)
    shapes = iv.sorted_unique(names.shape[host.name[rows]].astype(np.int64))
    labelled = parallelism_of({names.shaped[int(i)] for i in shapes})
    forward = rows[named(FORWARD_MARKS)[host.name[rows]]] if rows.size else rows
    main = int(np.bincount(host.thread[forward]).argmax()) if forward.size else -1
    launch = launchers[coll.op] if len(coll.op) else np.zeros(0, dtype=np.int64)
    known = launch >= 0
    at, thread = host.start[launch[known]], host.thread[launch[known]]
    optimizer = _enclosed(rows[named(OPTIMIZER_MARKS)[host.name[rows]]], tl, at, thread)
    backward = _enclosed(rows[named(BACKWARD_MARKS)[host.name[rows]]], tl, at, thread)
    if main != -1:
        backward |= thread != main  # autograd's device threads run the backward
    phases = np.full(len(coll.op), "unknown", dtype=object)
    phases[known] = np.where(optimizer, "optimizer", np.where(backward, "backward", "forward"))
    style = labelled or _inferred(coll.collective, training)
    return style, [role_of(c, str(p), style) for c, p in zip(coll.collective, phases, strict=True)]


def _enclosed(rows: I64, tl: Timeline, at: I64, thread: I32) -> np.ndarray:
    """For each launch (time ``at`` on ``thread``), whether one of ``rows`` on that thread spans it, ends included."""
    host = tl.host
    inside = np.zeros(at.shape, dtype=bool)
    for t in iv.sorted_unique(thread.astype(np.int64)):
        mine = rows[host.thread[rows] == t]
        if mine.size:
            on = thread == t
            inside[on] = iv.covered(iv.union(host.start[mine], host.end[mine] + 1), at[on])
    return inside


def _inferred(kinds: list[str], training: bool) -> str:
    """DDP's pattern without its label: a training program's all-reduces, and no parameter all-gather or
    reduce-scatter. Without a backward pass there are no gradients: all-reduces alone are tensor parallelism
    (a serving engine's layers summing their activations)."""
    if "all_reduce" not in kinds or any(k in ("all_gather", "reduce_scatter") for k in kinds):
        return "unknown"
    return "ddp" if training else "tensor_parallel"


def role_split(coll: Collectives, roles: list[str], devices: list[DeviceIdle]) -> list[CommRole]:
    """Communication by role: count, device time, bytes, and the exposed time (collective time with no
    compute beside it) of each, where two collectives overlap charged to the one that started first.
    The roles' exposed times add up to the communication report's ``exposed_s``."""
    exposed = np.zeros(len(coll.op), dtype=np.int64)
    for d in devices:
        on = np.flatnonzero(coll.device == d.device)
        if on.size == 0:
            continue
        free = _minus(d.comm, d.busy)
        on = on[np.argsort(coll.start[on], kind="stable")]
        s = np.clip(coll.start[on], d.window[0], d.window[1])
        e = np.clip(coll.end[on], d.window[0], d.window[1])
        reach = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1]))
        s = np.maximum(s, reach)
        e = np.maximum(e, s)
        exposed[on] = _measure_below(free, e) - _measure_below(free, s)
    out: dict[str, list[int]] = {}
    dur = coll.end - coll.start
    for i, role in enumerate(roles):
        acc = out.setdefault(role, [0, 0, 0, 0])
        acc[0] += 1
        acc[1] += int(dur[i])
        acc[2] += int(exposed[i])
        acc[3] += max(int(coll.nbytes[i]), 0)
    return sorted((CommRole(role=r, count=a[0], comm_s=a[1] / 1e9, exposed_s=a[2] / 1e9, bytes=a[3])
                   for r, a in out.items()), key=lambda c: (-c.exposed_s, c.role))


def _minus(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    """``a`` without ``b``: the parts of ``a`` not covered by ``b``."""
    if a[0].size == 0:
        return a
    lo, hi = int(a[0][0]), int(a[1][-1])
    return iv.intersect(a, iv.complement(b, lo, hi))


def _measure_below(s: iv.Intervals, t: I64) -> I64:
    """For each point, how much of the set lies before it."""
    starts, ends = s
    if starts.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(ends - starts)))
    k = np.searchsorted(starts, t, side="right")
    inside = np.where(k > 0, np.minimum(t, ends[np.maximum(k - 1, 0)]) - starts[np.maximum(k - 1, 0)], 0)
    return (before[np.maximum(k - 1, 0)] + np.maximum(inside, 0)) * (k > 0)
