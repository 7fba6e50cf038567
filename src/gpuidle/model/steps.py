"""The in-process step tracker's per-rank JSONL log, read back as a :class:`StepSeries` per rank.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from .timeline import I64

# ----------------------------------------------------------------------------------
# The in-process step tracker (live/tracker/): one JSONL log per rank, read back as a
# StepSeries per rank. Times are integer nanoseconds.
# ----------------------------------------------------------------------------------

TRACKER_FORMAT = "gpuidle.tracker/1"
TRACKER_SOURCE = "tracker"
"""A tracker job's ``source.format`` in its analysis report (the logs' own schema is :data:`TRACKER_FORMAT`)."""
"""The first line of a tracker log: ``{"type": "header", "format": "gpuidle.tracker/1", ...}``."""
TRACKER_LOG = "rank-{rank}.jsonl"
"""One log per rank, in the tracker's output folder."""
TRACKER_SUMMARY = "gpuidle-summary.json"
"""The job's :class:`AnalysisReport`, written by rank 0 when the tracker closes."""
TRACKER_OTHER = "other"
"""The phase column that sums every phase without a column of its own."""


class TrackerHeader(msgspec.Struct, tag="header", kw_only=True, omit_defaults=True):
    """First line of one rank's tracker log: who measured, on what, and how."""

    format: str
    """:data:`TRACKER_FORMAT`; always written, so a reader can tell the log's version."""
    rank: int
    world_size: int
    timing: str
    """``device``: phases timed with device events (CUDA); ``host``: with the host clock only."""
    device: int = 0
    device_name: str | None = None
    host: str = ""
    pid: int = 0
    t0: float = 0.0
    """Unix time of the tracker's start, in seconds."""
    phases: list[str] = []
    """Phases with a column of their own; any other phase adds to :data:`TRACKER_OTHER`."""
    compute_phases: list[str] = []
    """Phases whose time is the device's work: they make up busy time."""
    copy_phase: str = "h2d"
    """The phase that copies the batch to the device; its host time is ``memcpy`` idle."""
    every: int = 50
    """Steps between two exchanges of statistics across ranks."""
    notes: list[str] = []
    framework: str | None = None
    """``tensorflow`` or ``jax`` for those trackers (the advice speaks their API); absent: PyTorch."""
    process_groups: list[dict[str, Any]] = []
    """This rank's process groups when the tracker started, as a profile's ``distributedInfo.pg_config`` holds
    them (``pg_name``, ``pg_desc``, ``pg_size``, ``ranks``): its place in the job's mesh."""


class TrackerStep(msgspec.Struct, tag="step", kw_only=True, omit_defaults=True):
    """One training step on one rank."""

    step: int
    start_ns: int
    """Host clock at the start of the step, from the tracker's start."""
    dur_ns: int
    """Host time from the end of the previous step (or the first batch request) to this one's end."""
    data_ns: int = 0
    """Waiting for the next batch: host time in the loader (PyTorch, Keras); for JAX, which runs ahead of the
    device, the device's idle while the host was in the loader."""
    phases: dict[str, int] = {}
    """Host time per phase."""
    device_phases: dict[str, int] = {}
    """Device time per phase (between device events); empty when timed on the host."""
    comm_ns: int = 0
    """Union of the DDP buckets' communication, each from its bucket ready to its future done."""
    comm_exposed_ns: int = 0
    """Communication still running after the last bucket was ready, when nothing was left to overlap it."""
    straggler_ns: int = 0
    """The part of ``comm_exposed_ns`` spent waiting for the last rank to hand in its gradients."""
    buckets: int = 0
    bucket_bytes: int = 0
    """Bytes of the gradient buckets handed to the communication hook."""
    samples: int = 0
    batches: int = 0
    profiled: bool = False
    """A ``torch.profiler`` capture ran in this step: its times include the profiler's cost."""
    sync_ns: int = 0
    """The device's idle that the host's syncs caused (JAX: ``float(x)``, ``block_until_ready``, printing arrays)."""
    syncs: int = 0
    """Host syncs the loop made in this step, where the tracker sees them (JAX)."""


class TrackerEnd(msgspec.Struct, tag="end", kw_only=True, omit_defaults=True):
    """Last line of a tracker log, written by ``close()``; a log without it was cut short."""

    steps: int
    comm_hook: str | None = None
    """The DDP communication hook that was timed (``allreduce_hook``, or the user's); None: none."""
    comm_settings: dict[str, str] = {}
    """The framework's communication settings the tracker read (DeepSpeed: ``overlap_comm``, bucket sizes)."""
    notes: list[str] = []
    unmeasured: list[str] = []
    """Idle causes the tracker could not measure in this run (``data_loading``)."""


TrackerLine = TrackerHeader | TrackerStep | TrackerEnd


class StepSeries(msgspec.Struct):
    """One rank's steps as the tracker measured them: columns of nanoseconds, one row per step."""

    rank: int
    world_size: int
    path: str
    timing: str
    """``device`` or ``host``, as :attr:`TrackerHeader.timing`."""
    device: int
    device_name: str | None
    compute_phases: list[str]
    copy_phase: str
    step: I64
    start: I64
    dur: I64
    data: I64
    phases: dict[str, I64]
    """Host time per phase column."""
    device_phases: dict[str, I64]
    """Device time per phase column; empty when timed on the host."""
    comm: I64
    comm_exposed: I64
    straggler: I64
    buckets: I64
    bucket_bytes: I64
    samples: I64
    batches: I64
    profiled: npt.NDArray[np.bool_]
    comm_hook: str | None = None
    comm_settings: dict[str, str] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    sync: I64 | None = None
    """Idle caused by host syncs per step (:attr:`TrackerStep.sync_ns`); None: not measured (PyTorch)."""
    syncs: I64 | None = None
    framework: str | None = None
    """``tensorflow``, ``jax``; None or ``pytorch``: PyTorch."""
    unmeasured: list[str] = msgspec.field(default_factory=list)
    """As :attr:`TrackerEnd.unmeasured`."""
    process_groups: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """As :attr:`TrackerHeader.process_groups`."""

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @property
    def device_timed(self) -> bool:
        return self.timing == "device"

    def compute(self) -> I64:
        """Time of the compute phases per step: on the device when it was timed there, else on the host."""
        source = self.device_phases if self.device_timed else self.phases
        total = np.zeros(len(self), dtype=np.int64)
        for name in self.compute_phases:
            if name in source:
                total += source[name]
        return total

    def copy(self) -> I64:
        """Host time of the copy phase per step: what a blocking host-to-device copy costs the loop."""
        col = self.phases.get(self.copy_phase)
        return col.copy() if col is not None else np.zeros(len(self), dtype=np.int64)

    def select(self, rows: npt.NDArray[np.bool_]) -> StepSeries:
        """The same series restricted to the rows where ``rows`` is true."""
        return StepSeries(
            rank=self.rank, world_size=self.world_size, path=self.path, timing=self.timing,
            device=self.device, device_name=self.device_name, compute_phases=self.compute_phases,
            copy_phase=self.copy_phase, step=self.step[rows], start=self.start[rows], dur=self.dur[rows],
            data=self.data[rows], phases={k: v[rows] for k, v in self.phases.items()},
            device_phases={k: v[rows] for k, v in self.device_phases.items()}, comm=self.comm[rows],
            comm_exposed=self.comm_exposed[rows], straggler=self.straggler[rows], buckets=self.buckets[rows],
            bucket_bytes=self.bucket_bytes[rows], samples=self.samples[rows], batches=self.batches[rows],
            profiled=self.profiled[rows], comm_hook=self.comm_hook, comm_settings=dict(self.comm_settings),
            notes=list(self.notes),
            sync=self.sync[rows] if self.sync is not None else None,
            syncs=self.syncs[rows] if self.syncs is not None else None, framework=self.framework,
            process_groups=self.process_groups,
        )
