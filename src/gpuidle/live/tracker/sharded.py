"""Which communication the tracker can time for a model: FSDP2 (``fully_shard``), a DeepSpeed engine, or none.

DDP is timed through its comm hook (:mod:`.ddp`); this module handles the other models given as
``StepTracker(model=...)``, and says in one line when a model's communication cannot be timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import deepspeed, fsdp
from .clock import DeviceClock
from .fsdp import CommSink
from .phases import CommTarget

Summary = Callable[[DeviceClock, list[list[Any]]], tuple[int, int, int, int]]
"""One step's entries in, ``(communication ns, exposed ns, collectives, bytes)`` out."""


@dataclass(slots=True)
class Watched:
    hook: str | None
    """What the log records as ``comm_hook``: ``fully_shard``, ``deepspeed_zero3``, ...; None: not timed."""
    summary: Summary | None
    sink: CommSink | None
    notes: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    """The framework's communication settings, for the advice (DeepSpeed's ``overlap_comm``, bucket sizes)."""


def untimed(model: object) -> str:
    return (f"communication not timed: {type(model).__name__} is neither DistributedDataParallel, FSDP2 "
            "(fully_shard) nor a DeepSpeed engine; data wait, phases and steps are timed")


def watch(tracker: CommTarget, model: Any) -> Watched:
    """Time what can be timed of ``model``'s communication, reporting to ``tracker``."""
    if deepspeed.is_engine(model):
        sink = CommSink(tracker)
        return Watched(deepspeed.hook_name(model), deepspeed.summary, sink, deepspeed.register(model, sink),
                       deepspeed.settings(model))
    if fsdp.sharded_modules(model):
        sink = CommSink(tracker)
        return Watched(fsdp.HOOK_NAME, fsdp.summary, sink, fsdp.register(model, sink))
    return Watched(None, None, None, [untimed(model)])
