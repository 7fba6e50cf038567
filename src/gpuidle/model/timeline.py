"""Timeline columns: what every source produces for one rank, in integer nanoseconds.

Times inside a :class:`Timeline` are integer nanoseconds (``int64``) measured from
``meta.t0_ns``, the earliest timestamp of the trace; add ``t0_ns`` back to get the
trace's own clock.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.model.arrays import distinct

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]

SCHEMA = "gpuidle.analysis/1"
SCHEMA_MINOR = 15
"""Minor version of :data:`SCHEMA`: additions only (1: the ``job`` object; 2: ``steps[].excluded``,
``combined``, ``alternative_to``, nullable gains with their reason, devices' compute capability;
3: ``source.framework``; 4: ``ranks[].backend``; 5: gains' ``step_s_saved_low``/``_high``, ``basis``,
``assumption`` and ``scope``, ``combined``'s range, ``communication.parallelism`` and ``communication.roles``
in ranks and job, ``ranks[].startup``, ``ranks[].workload``, ``ranks[].python_hotspots``,
``steps[].startup_s``/``exposed_comm_s``/``zero_grad_launch_s``, ``devices[].startup_s``/``kernel_arch``,
``collectives[].dtype``; 6: ``communication.parallelism`` ``tensor_parallel``: an inference program's
all-reduces, once read as DDP; 7: ``communication.settings``, the framework's settings the tracker read;
8: ``devices[].window_s`` is the window less its start-up, ``busy_s + idle_s = window_s``: a report of an
earlier minor is read so; 9: ``ranks[].sync_sources``, step sources ``device_steps``, ``engine_iterations``,
``named_ranges``; 10: ``steps[].main_calls``, ``communication.mesh``, ``steps[].comm_by_dim_s``; 11: ``scale_out``,
the job at more GPUs; 12: ``declined``, ``steps[].zero_grad_s``, ``ranks[].workload.libraries``; 13: ``quality``
and ``ranks[].quality``, what the trace cannot tell, no longer among the fixes; step sources ``repeating_ranges``
and ``device_period``; 14: step source ``repeating_device_ranges``, a range on the GPU's own timeline;
``host_side``, the ranks whose device records were lost, reported from their host side alone; 15:
``job.missing_ranks`` lists at most the lowest 4,096, ``world_size`` less the ranks found counts them all)."""
WINDOW_LESS_STARTUP = 8
"""The minor from which ``devices[].window_s`` leaves start-up out."""


class Cause(enum.StrEnum):
    """Why a device was idle. Every idle nanosecond gets exactly one cause.

    The order is the order of reports, not a priority; see ``analysis.idle`` for that.
    """

    DATA_LOADING = "data_loading"
    HOST_SYNC = "host_sync"
    LAUNCH_OVERHEAD = "launch_overhead"
    CPU_COMPUTE = "cpu_compute"
    MEMCPY = "memcpy"
    COMMUNICATION = "communication"
    STRAGGLER_WAIT = "straggler_wait"
    UNATTRIBUTED = "unattributed"


CAUSES: tuple[Cause, ...] = tuple(Cause)


class DeviceOpKind(enum.IntEnum):
    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    COLLECTIVE = 3
    """A communication kernel (NCCL/RCCL); not compute, see ``analysis.idle``."""


class HostKind(enum.IntEnum):
    OP = 0
    """An operator (``cpu_op``): dispatcher work that may launch device work."""
    RUNTIME = 1
    """A CUDA/HIP runtime or driver call (launch, copy, synchronize, ...)."""
    ANNOTATION = 2
    """A ``record_function`` range: profiler steps, DataLoader, user ranges."""
    PYTHON = 3
    """A Python function (Kineto ``python_function``, recorded with ``with_stack=True``)."""


FILE_READ_CALLS = frozenset({"read", "pread", "pread64", "readv", "preadv", "readv2", "preadv2", "preadv64",
                             "fread", "fread_unlocked"})
"""OS calls that read a file: the one list a reader filters OS-runtime traces with and analysis classifies by."""
LAUNCH_CALL = re.compile(r"^(cuda|hip|cu)(LaunchKernel|LaunchKernelExC?|LaunchCooperativeKernel|ModuleLaunchKernel"
                         r"|ExtLaunchKernel|GraphLaunch)(_v\d+)?$")
"""A runtime or driver call that launches device work: where it carries a correlation id and no device record
follows it anywhere in a trace, the trace lost its device records."""
XSPACE_FORMAT = "xspace"
"""``source.format`` of JAX and TensorFlow profiles."""
HOST_RANK_NOTE = "one rank per host:"
"""How an XSpace rank's note begins: a profile is one host's and names no rank, so its rank is its place among
host profiles, said in this note."""
XLA_DISPATCH = (
    r"^PjitFunction\(|ExecuteReplicated|LoadedExecutable::Execute$|^PJRT_LoadedExecutable_Execute$"
    r"|^EagerExecute$|^EagerLocalExecute: |^TFE_Py_(Fast[A-Za-z]*)?Execute"
)
"""A compiled program (or an eager op) handed to the XLA/TensorFlow runtime: the framework's launch path, read as
a runtime call by the XSpace reader and as launching by the idle analysis (its time is dispatch, not Python)."""


class CopyKind(enum.IntEnum):
    NONE = 0
    HTOD_PAGEABLE = 1
    HTOD_PINNED = 2
    HTOD = 3
    """Host to device, memory kind not recorded (ROCm writes ``Host -> Device``)."""
    DTOH_PAGEABLE = 4
    DTOH_PINNED = 5
    DTOD = 6
    OTHER = 7


HTOD_KINDS = (CopyKind.HTOD_PAGEABLE, CopyKind.HTOD_PINNED, CopyKind.HTOD)


class DeviceOps(msgspec.Struct, frozen=True):
    """Work that ran on a device: kernels, copies, sets, collectives. One row each."""

    start: I64
    end: I64
    device: I32
    stream: I32
    kind: I8
    name: I32
    """Index into :attr:`Timeline.strings`."""
    correlation: I64
    """Links the row to the runtime call that launched it; -1 when unknown."""
    copy_kind: I8
    nbytes: I64
    """Bytes moved by a copy or set; -1 when unknown or not a copy."""

    def __len__(self) -> int:
        return int(self.start.shape[0])


class DeviceRanges(msgspec.Struct, frozen=True):
    """Ranges the program marked on a device's own timeline: a ``record_function`` range as the device ran it,
    from its first work to its last (Kineto's ``gpu_user_annotation``). On the device's clock; not work, never
    busy time."""

    start: I64
    end: I64
    device: I32
    stream: I32
    name: I32
    """Index into :attr:`Timeline.strings`."""

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @classmethod
    def none(cls) -> DeviceRanges:
        empty = np.zeros(0, dtype=np.int64)
        small = np.zeros(0, dtype=np.int32)
        return cls(empty, empty.copy(), small, small.copy(), small.copy())


class HostEvents(msgspec.Struct, frozen=True):
    """Ranges recorded on host threads: operators, runtime calls, annotations."""

    start: I64
    end: I64
    thread: I32
    """Index into :attr:`Timeline.threads`."""
    kind: I8
    name: I32
    correlation: I64
    """For runtime calls: the id shared with the device work they launched; else -1."""

    def __len__(self) -> int:
        return int(self.start.shape[0])


class CollectiveCalls(msgspec.Struct, frozen=True):
    """Host-side collective records (``record_param_comms``, ``nccl:*`` ranges).

    ``host_index`` points into :attr:`Timeline.host`; sizes are -1 when the trace
    does not record them.
    """

    host_index: I64
    collective: list[str]
    process_group: list[str]
    in_bytes: I64
    out_bytes: I64
    group_size: I32
    dtype: list[str] = msgspec.field(default_factory=list)
    """Element type per call as the trace spells it (``Float``, ``BFloat16``, ``unsigned char``); "" unknown."""

    def __len__(self) -> int:
        return int(self.host_index.shape[0])


class Steps(msgspec.Struct, frozen=True):
    """Training iterations: ``[start, end)`` per step, in host time."""

    number: I64
    start: I64
    end: I64
    source: str
    """``profiler_step``, ``inferred:<method>`` or ``none``."""

    def __len__(self) -> int:
        return int(self.number.shape[0])


class TraceMeta(msgspec.Struct):
    path: str
    format: str
    t0_ns: int
    """Trace clock of time zero, in ns."""
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device_names: dict[int, str] = msgspec.field(default_factory=dict)
    device_capability: dict[int, str] = msgspec.field(default_factory=dict)
    """Compute capability per device, ``"major.minor"`` (Kineto ``deviceProperties``; gfx9 on ROCm is ``9.x``)."""
    process_groups: list[dict[str, Any]] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    framework: str | None = None
    """The program's framework where the trace tells (``pytorch``, ``jax``, ``tensorflow``, ``cuda`` for a plain
    CUDA application)."""
    kernel_arch: dict[int, str] = msgspec.field(default_factory=dict)
    """Per device, the GPU family its kernel names were built for (``volta``, ``sm90``, ``gfx942``...)."""
    header_flags: dict[str, Any] = msgspec.field(default_factory=dict)
    """Recording options the trace header states (Kineto ``with_stack``, ``record_shapes``)."""
    device_records_lost: int = 0
    """Kernel launches with a correlation id where the trace holds no device record at all: the device's activity
    was recorded and lost (a full buffer, a dropped activity kind); the timeline has the host side alone."""


@dataclass(slots=True)
class Timeline:
    """Everything one rank's trace says, in columns. Built once by a source."""

    strings: list[str]
    threads: list[tuple[str, str]]
    """(pid, tid) per thread index, as the trace spells them."""
    device_ops: DeviceOps
    host: HostEvents
    collectives: CollectiveCalls
    steps: Steps
    meta: TraceMeta
    handoffs: list[tuple[int, int]] = field(default_factory=list)
    """(thread, thread) pairs, indices into :attr:`threads`: the first hands work to the second (a Python
    thread dispatching a compiled program to the thread that runs it and launches its kernels). Profilers
    that record such flows (XSpace) fill it; a thread handing work to a launching thread feeds the device."""
    device_steps: dict[int, Steps] = field(default_factory=dict)
    """Each device's own steps, where the devices run their steps apart (an XSpace profile's ``Steps`` line per
    GPU, two GPUs' bursts hundreds of ms apart): each device's figures are over its own steps; :attr:`steps` is the
    busiest device's. Empty where one set of steps holds for every device."""
    device_ranges: DeviceRanges = field(default_factory=DeviceRanges.none)
    """Ranges marked on the devices' own timelines (Kineto's GPU annotation track), where the trace holds them."""
    devices: list[int] = field(init=False)
    """Device indices with any activity, ascending."""

    def __post_init__(self) -> None:
        self.devices = [int(d) for d in distinct(self.device_ops.device)]


