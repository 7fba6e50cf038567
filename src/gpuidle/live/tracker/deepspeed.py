"""A DeepSpeed engine's communication, as far as the tracker can time it without stalls.

Written against DeepSpeed's documented engine API (``deepspeed.initialize`` returns a
``DeepSpeedEngine``: ``engine.module`` is the wrapped model, ``engine.zero_optimization_stage()``
the ZeRO stage); DeepSpeed is imported by nobody here, so the tracker runs where it is not installed.
Under ZeRO-3 every submodule with partitioned parameters (``ds_id`` on its parameters) fetches them
in DeepSpeed's own pre-forward and pre-backward hooks; the tracker brackets those hooks as it does
FSDP2's (:func:`.fsdp.bracket`): the time between its two hooks is the wait for the all-gather.
DeepSpeed runs its collectives through ``deepspeed.comm``, which takes no hook: their own time and
ZeRO-1/2's gradient reduction inside the engine's backward are not timed (a note says so).
"""

from __future__ import annotations

from typing import Any

import torch

from .clock import DeviceClock
from .ddp import comm_times
from .fsdp import WAIT, CommSink, bracket


def is_engine(model: object) -> bool:
    """A DeepSpeed engine, told by its class's module and its documented methods (no import of deepspeed)."""
    return type(model).__module__.startswith("deepspeed") and callable(getattr(model, "zero_optimization_stage", None))


def stage(engine: Any) -> int:
    return int(engine.zero_optimization_stage())


def hook_name(engine: Any) -> str:
    """The ``comm_hook`` the log records: the style, ``deepspeed_zero3``, ``deepspeed_zero1_2`` or ``deepspeed``."""
    s = stage(engine)
    return "deepspeed_zero3" if s == 3 else "deepspeed_zero1_2" if s in (1, 2) else "deepspeed"


def register(engine: Any, sink: CommSink) -> list[str]:
    """Bracket ZeRO-3's parameter fetch hooks; return what is not timed."""
    module: torch.nn.Module = engine.module
    if stage(engine) != 3:
        return [f"DeepSpeed ZeRO-{stage(engine)}: the gradient reduction inside the engine's backward is not timed; "
                "tracker.profile(steps=...) records it"]
    fetched = [m for m in module.modules() if any(hasattr(p, "ds_id") for p in m.parameters(recurse=False))]
    for m in fetched:
        bracket(m, sink)
    return ["DeepSpeed ZeRO-3: the waits for parameter all-gathers are timed; the collectives' own time and the "
            "gradient reduce-scatter are not (deepspeed.comm takes no hook)"]


def summary(clock: DeviceClock, entries: list[list[Any]]) -> tuple[int, int, int, int]:
    """``(communication, exposed, collectives, bytes)``: only waits are known, so both times are the waits."""
    waits = [e for e in entries if e[3] == WAIT and e[1] is not None]
    waited = sum(max(0, clock.elapsed_ns(e[0], e[1])) for e in waits)
    comm, _ = comm_times(clock, waits)
    return comm, waited, 0, 0
