"""A DeepSpeed engine's communication, as far as the tracker can time it without stalls.

Written against DeepSpeed's engine API (``deepspeed.initialize`` returns a ``DeepSpeedEngine``:
``engine.module`` is the wrapped model, ``engine.zero_optimization_stage()`` the ZeRO stage) and
checked on DeepSpeed 0.19 (CPU accelerator, gloo, two processes: ``tests/test_tracker_deepspeed.py``);
DeepSpeed is imported by nobody here, so the tracker runs where it is not installed.

- **Collectives.** Every ZeRO stage reduces gradients, and ZeRO-3 gathers parameters, through
  ``deepspeed.comm``, whose functions call one backend object (``deepspeed.comm.comm.cdb``). The
  tracker wraps that object's collectives, marking each when it is issued and when it is done, as
  the DDP hook marks buckets (:mod:`.ddp`). A collective called without ``async_op`` on the compute
  stream (any, on a CPU) holds the training until it is done: all of its time is exposed. One
  issued with ``async_op`` runs beside the training: the time after the last one was issued is
  exposed (the wait at the end of backward, as for DDP's last bucket).
- **ZeRO-3's parameter fetch.** Every submodule with partitioned parameters (``ds_id`` on its
  parameters) fetches them in DeepSpeed's own pre-forward and pre-backward hooks; the tracker
  brackets those hooks as it does FSDP2's (:func:`.fsdp.bracket`): the time between its two hooks
  is exposed.

A rank's wait for a slower one lands in its exposed time, where the exchange across ranks finds it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from .clock import DeviceClock
from .ddp import comm_times
from .fsdp import WAIT, CommSink, bracket

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor", "reduce_scatter",
               "all_gather_into_tensor", "all_gather", "all_to_all_single", "reduce")
"""The backend's methods that move tensors across ranks (``deepspeed/comm/torch.py``)."""
BLOCKING, ISSUED = "blocking", "issued"
"""A collective that holds the training until done; one that runs beside it."""


def is_engine(model: object) -> bool:
    """A DeepSpeed engine, told by its class's module and its documented methods (no import of deepspeed)."""
    return type(model).__module__.startswith("deepspeed") and callable(getattr(model, "zero_optimization_stage", None))


def stage(engine: Any) -> int:
    return int(engine.zero_optimization_stage())


def hook_name(engine: Any) -> str:
    """The ``comm_hook`` the log records: the style, ``deepspeed_zero3``, ``deepspeed_zero1_2`` or ``deepspeed``."""
    s = stage(engine)
    return "deepspeed_zero3" if s == 3 else "deepspeed_zero1_2" if s in (1, 2) else "deepspeed"


SETTINGS = ("overlap_comm", "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients")
"""The ZeRO settings the advice needs, read through the engine's ``zero_<name>()`` methods."""


def settings(engine: Any) -> dict[str, str]:
    """The engine's ZeRO communication settings as JSON writes them (``true``, ``500000000``); missing ones left out."""
    out = {}
    for name in SETTINGS:
        read = getattr(engine, f"zero_{name}", None)
        if callable(read):
            try:
                value = read()
            except Exception:  # a setting this version reads elsewhere: left out, never an error
                continue
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def register(engine: Any, sink: CommSink) -> list[str]:
    """Time the engine's collectives and, under ZeRO-3, its parameter fetches; return what is not timed."""
    notes = []
    if not time_collectives(sink):
        notes.append("DeepSpeed's collectives not timed: deepspeed.comm has no backend object (cdb) to wrap")
    if stage(engine) == 3:
        module: torch.nn.Module = engine.module
        for m in module.modules():
            if any(hasattr(p, "ds_id") for p in m.parameters(recurse=False)):
                bracket(m, sink)
    return notes


def time_collectives(sink: CommSink) -> bool:
    """Wrap the collectives of ``deepspeed.comm``'s backend once per process; they report to ``sink`` from now on."""
    backend = getattr(sys.modules.get("deepspeed.comm.comm"), "cdb", None)
    if backend is None:
        return False
    backend._gpuidle_sink = sink
    for name in COLLECTIVES:
        op = getattr(backend, name, None)
        if callable(op) and not getattr(op, "_gpuidle_timed", False):
            setattr(backend, name, _timed(backend, op))
    return True


def _timed(backend: Any, op: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        sink: CommSink = backend._gpuidle_sink
        issued = bool(kwargs.get("async_op", False))
        kind = ISSUED if issued or not _on_compute_stream() else BLOCKING
        entry = sink.start(kind, max(map(_nbytes, (*args, *kwargs.values())), default=0))
        work = op(*args, **kwargs)
        if entry is not None:
            if issued and hasattr(work, "get_future"):
                work.get_future().then(lambda _: sink.end(entry))
            else:  # done on the host, or ordered on the current stream: the marker after it waits for it
                sink.end(entry)
        return work

    timed._gpuidle_timed = True  # type: ignore[attr-defined]
    return timed


def _on_compute_stream() -> bool:
    """Without CUDA the host waits; with it, a collective on a side stream (``overlap_comm``) runs beside compute."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return True
    return bool(torch.cuda.current_stream() == torch.cuda.default_stream())


def _nbytes(arg: Any) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in arg if isinstance(t, torch.Tensor))
    return 0


def summary(clock: DeviceClock, entries: list[list[Any]]) -> tuple[int, int, int, int]:
    """``(communication, exposed, collectives, bytes)`` of one step: communication is the union of the collectives'
    spans and the fetch waits (a wait holds a collective and DeepSpeed's work around it); exposed, the union of the
    fetch waits, the blocking collectives and the issued ones' tail: a part of the communication."""
    done = [e for e in entries if e[1] is not None]
    colls = [e for e in done if e[3] != WAIT]
    comm, _ = comm_times(clock, done)
    held = [e for e in done if e[3] in (WAIT, BLOCKING)]
    issued = [e for e in colls if e[3] == ISSUED]
    if issued:
        ref = issued[0][0]
        last = max(issued, key=lambda e: clock.elapsed_ns(ref, e[0]))
        end = max(issued, key=lambda e: clock.elapsed_ns(ref, e[1]))
        held.append([last[0], end[1]])
    exposed, _ = comm_times(clock, held)
    return comm, exposed, len(colls), sum(int(e[2]) for e in colls)
