"""A rank reported from its host side alone: its trace recorded the launches and lost every device record.

Such a trace holds no device figure to give (no busy time, so no utilization and no idle to split into causes):
the report says what the host did instead, and the block above the fixes says the device's records were lost.
"""

from __future__ import annotations

import msgspec

from .quality import TraceQuality

HOST_ACTIVITIES = ("operators", "launch", "sync", "copy", "data_loading", "collective")
"""What the host's launching threads were inside, each the union of its calls' time (they nest: a launch inside an
operator counts in both, so they do not add up): framework operators, kernel launch calls, waits on the device
(synchronize calls, ``.item()``), copy calls, data loading, host-side collective calls."""


class HostCall(msgspec.Struct):
    """One name of host call on the launching threads: how often it ran and for how long."""

    name: str
    count: int
    """Its outermost calls (one nested in another of the same name counts once)."""
    total_s: float
    """Their summed time."""
    share: float
    """Of the window."""


class HostStep(msgspec.Struct):
    """One step as the host ran it."""

    step: int
    start_s: float
    dur_s: float
    launches: int
    """Kernel launch calls begun in the step."""
    activity_s: dict[str, float]
    """By :data:`HOST_ACTIVITIES`, the time the launching threads were inside such calls in the step."""


class HostSide(msgspec.Struct, kw_only=True):
    """What one rank's host did, where its trace lost every device record."""

    rank: int
    path: str
    lost_launches: int
    """Kernel launch calls with a correlation id and no device record: every one of them, as the trace holds none."""
    step_source: str
    """As :attr:`RankReport.step_source`: the profiler's step markers, an engine's iterations, ...; ``none``."""
    start_s: float
    dur_s: float
    """The window: the steps' span, else the launching threads' first to last event (seconds from the trace's
    first event)."""
    threads: int
    """The host threads that launched kernels: the ones whose time is reported."""
    steps: list[HostStep] = []
    activity_s: dict[str, float] = {}
    """As :attr:`HostStep.activity_s`, over the window."""
    top_calls: list[HostCall] = []
    """The host operators with the most time on the launching threads, most first."""
    host_events: dict[str, int] = {}
    """As :attr:`RankReport.host_events`."""
    notes: list[str] = []
    quality: list[TraceQuality] = []
    """What the trace cannot tell: its device records lost, first."""
    world_size: int | None = None
    backend: str | None = None
