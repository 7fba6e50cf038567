"""FSDP2's communication, timed: its all-gathers and reduce-scatters, and the waits they cause.

``fully_shard`` takes a custom all-gather and reduce-scatter per module (``set_custom_all_gather``,
``set_custom_reduce_scatter``): the tracker sets wrappers around FSDP2's default ones that mark
each collective when it is issued and when it is done, as the DDP hook marks buckets (:mod:`.ddp`):
the done marker comes from the work's future callback, or right after the call for a collective
that is ordered on its stream (no work object). Markers are host timestamps without CUDA and CUDA
events otherwise, read late, so nothing stalls.

Exposed communication is what the training waited for:

- before a module's forward or backward, FSDP2 waits for the module's all-gather. The tracker
  brackets FSDP2's own hooks with hooks of its own, one before and one after (module pre-forward
  hooks; tensor hooks on the module's outputs for backward); the time between them is the wait
  (device time on CUDA: the compute stream waits there; host time on a CPU);
- at the end of backward FSDP2 waits for the last reduce-scatter: the reduce-scatters' time after the
  last one was issued (as for DDP's last bucket).

The same brackets time ZeRO-3's parameter fetch under a DeepSpeed engine (:mod:`.deepspeed`).
HSDP's all-reduce across replicas is not handed to a custom hook: it is not timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.utils import hooks

from .clock import DeviceClock
from .ddp import comm_times
from .phases import CommTarget

HOOK_NAME = "fully_shard"
"""The ``comm_hook`` an FSDP2 job's log records (its style is ``fsdp2``)."""
GATHER_FORWARD, GATHER_BACKWARD, REDUCE, WAIT = "all_gather_forward", "all_gather_backward", "reduce_scatter", "wait"


class CommSink:
    """Where the wrappers and hooks report: the tracker's open step while it runs, nothing once it closed."""

    __slots__ = ("tracker",)

    def __init__(self, tracker: CommTarget) -> None:
        self.tracker: CommTarget | None = tracker

    def start(self, kind: str, nbytes: int) -> list[Any] | None:
        """A new entry ``[start marker, end marker, bytes, kind]`` in the open step; None after close."""
        t = self.tracker
        if t is None:
            return None
        entry = [t._comm_clock.mark(), None, nbytes, kind]
        t._open.comm.append(entry)
        return entry

    def end(self, entry: list[Any]) -> None:
        t = self.tracker
        if t is not None:
            entry[1] = t._comm_clock.mark()


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


def _finish(sink: CommSink, entry: list[Any] | None, work: dist.Work | None) -> None:
    if entry is None:
        return
    if work is None:  # ordered on its stream, or already complete on the host
        sink.end(entry)
        return

    def done(_: torch.futures.Future[Any]) -> None:
        sink.end(entry)

    work.get_future().then(done)


class TimedAllGather(AllGather):
    """FSDP2's all-gather, marked when issued and when done."""

    def __init__(self, sink: CommSink, inner: AllGather | None = None) -> None:
        self._sink = sink
        self._inner = inner if inner is not None else DefaultAllGather()

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self._inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        kind = GATHER_BACKWARD if _in_backward() else GATHER_FORWARD
        entry = self._sink.start(kind, output_tensor.numel() * output_tensor.element_size())
        work = self._inner(output_tensor, input_tensor, group, async_op)
        _finish(self._sink, entry, work)
        return work


class TimedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter, marked when issued and when done."""

    def __init__(self, sink: CommSink, inner: ReduceScatter | None = None) -> None:
        self._sink = sink
        self._inner = inner if inner is not None else DefaultReduceScatter()

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self._inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        entry = self._sink.start(REDUCE, input_tensor.numel() * input_tensor.element_size())
        work = self._inner(output_tensor, input_tensor, group, op, async_op)
        _finish(self._sink, entry, work)
        return work


def bracket(module: torch.nn.Module, sink: CommSink) -> list[hooks.RemovableHandle]:
    """Time the framework's pre-forward and pre-backward hooks of ``module``: hooks of ours before and after.

    Registered after the framework's: a prepended pre-forward hook runs before its pre-forward hooks, an
    appended one after. A prepended forward hook puts a tensor hook on the outputs before the framework
    puts its pre-backward hook there, an appended one after; tensor hooks run in that order in backward.
    """
    opened: list[list[Any] | None] = []

    def open_wait(*_: Any) -> None:
        opened.append(sink.start(WAIT, 0))

    def close_wait(*_: Any) -> None:
        entry = opened.pop() if opened else None
        if entry is not None:
            sink.end(entry)

    def on_outputs(action: Callable[..., None]) -> Callable[..., None]:
        def register(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad: action())  # type: ignore[no-untyped-call]
        return register

    return [
        module.register_forward_pre_hook(open_wait, prepend=True),
        module.register_forward_pre_hook(close_wait),
        module.register_forward_hook(on_outputs(open_wait), prepend=True),
        module.register_forward_hook(on_outputs(close_wait)),
    ]


def _tensors(output: Any) -> Iterable[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (list, tuple)):
        for o in output:
            yield from _tensors(o)
    elif isinstance(output, dict):
        for o in output.values():
            yield from _tensors(o)


def sharded_modules(model: torch.nn.Module) -> list[FSDPModule]:
    """The modules ``fully_shard`` was applied to, outermost first."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def register(model: torch.nn.Module, sink: CommSink) -> list[str]:
    """Time every ``fully_shard`` module of ``model``; return a note for each one that cannot be timed."""
    notes = []
    for m in sharded_modules(model):
        try:
            m.set_custom_all_gather(TimedAllGather(sink))
            m.set_custom_reduce_scatter(TimedReduceScatter(sink))
        except ValueError as err:  # several parameter groups in one module: no custom collective
            notes.append(f"FSDP2 collectives of {type(m).__name__} not timed: {err}")
        bracket(m, sink)  # type: ignore[arg-type]
    return notes


def summary(clock: DeviceClock, entries: list[list[Any]]) -> tuple[int, int, int, int]:
    """``(communication, exposed, collectives, bytes)`` of one step, in ns and bytes.

    Communication is the union of the collectives' spans; exposed, the waits before modules plus
    the reduce-scatters' time after the last one was issued (the wait at the end of backward).
    """
    waits = [(e[0], e[1]) for e in entries if e[3] == WAIT and e[1] is not None]
    colls = [e for e in entries if e[3] != WAIT]
    comm, _ = comm_times(clock, colls)
    _, tail = comm_times(clock, [e for e in colls if e[3] == REDUCE])
    waited = sum(max(0, clock.elapsed_ns(a, b)) for a, b in waits)
    return comm, waited + tail, len(colls), sum(int(e[2]) for e in colls)
