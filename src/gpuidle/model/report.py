"""The analysis report and comparisons: typed, serialised as-is to the versioned JSON schemas.

Reports carry seconds as floats, as the JSON contract says.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from .advice import Combined, CostResult, Declined, Recommendation
from .host_side import HostSide
from .jsonio import JsonStruct
from .mesh import MeshDim
from .quality import TraceQuality
from .scaleout import ScaleOut
from .timeline import CAUSES, I64, SCHEMA, SCHEMA_MINOR, WINDOW_LESS_STARTUP
from .units import duration

# ----------------------------------------------------------------------------------
# The report: typed, and serialised as-is to the versioned JSON schema.
# ----------------------------------------------------------------------------------


def zero_causes() -> dict[str, float]:
    return {c.value: 0.0 for c in CAUSES}


class Window(msgspec.Struct):
    """The span analysed, so a reader knows what "utilization" is a share of."""

    kind: str
    """``profiler_steps``, ``inferred_steps`` or ``gpu_activity``."""
    start_s: float
    """Start, in seconds from the first event of the trace."""
    dur_s: float


class DeviceReport(msgspec.Struct):
    device: int
    name: str | None
    window_s: float
    """The time analysed: the rank's window less its start-up (``startup_s``), so that
    ``busy_s + idle_s = window_s`` and ``utilization = busy_s / window_s`` in every report and command."""
    busy_s: float
    """Union of compute kernels, copies and sets. Exposed collectives are idle."""
    idle_s: float
    utilization: float
    idle_by_cause_s: dict[str, float]
    active_s: float
    """Union of all device work, collectives included: what nvidia-smi counts."""
    compute_capability: str | None = None
    """``"major.minor"`` where the source records it (Kineto ``deviceProperties``, the tracker)."""
    timing: str = "device"
    """``device``: measured on the device; ``host``: host-timed steps (no device figures can be claimed)."""
    startup_s: float = 0.0
    """Idle under one-time start-up costs (``RankReport.startup``): inside the rank's window
    (``RankReport.window``) but outside ``window_s``, every cause and every step."""
    kernel_arch: str | None = None
    """The GPU family the kernel names were built for (``volta``, ``ampere``, ``hopper``, ``sm90``, ``gfx942``,
    ``cdna``), where they tell: the least the device can be."""


class StepCall(msgspec.Struct):
    """The host call under most of one cause's idle in a step (``StepReport.main_calls``)."""

    name: str
    call_s: float
    """How long the call ran."""
    idle_s: float
    """The cause's device idle it covers in the step."""
    transfer_s: float | None = None
    """For a copy call, the device time of its transfer; None where it launched no copy."""

    def words(self) -> str:
        """``one cudaMemcpyAsync call of 463.0 ms, its transfer 4.5 µs``: the one wording every report uses."""
        transfer = "" if self.transfer_s is None else f", its transfer {duration(self.transfer_s)}"
        return f"one {self.name} call of {duration(self.call_s)}{transfer}"


class StepReport(msgspec.Struct):
    step: int
    start_s: float
    dur_s: float
    busy_s: float
    idle_s: float
    idle_by_cause_s: dict[str, float]
    excluded: str | None = None
    """Why the step is left out of per-step figures and gains: ``warmup``, ``profiler``, ``outlier``,
    ``no_gpu_work``; None: steady."""
    startup_s: float = 0.0
    """Idle under one-time start-up costs inside the step: not in ``dur_s``, ``idle_s`` or any cause."""
    exposed_comm_s: dict[str, float] = {}
    """The step's ``communication`` idle by the collective that ran, ``kind:dtype`` (``all_reduce:float32``,
    ``all_to_all:int8``; ``unknown`` where the trace does not say)."""
    zero_grad_launch_s: float = 0.0
    """The part of ``launch_overhead`` under an ``Optimizer.zero_grad`` range (per-parameter fills)."""
    zero_grad_s: dict[str, float] = {}
    """The idle under an ``Optimizer.zero_grad`` range by cause: the fills' launches (``launch_overhead``, as
    ``zero_grad_launch_s``), the host's loop over the parameters (``cpu_compute``, ``unattributed``)."""
    comm_by_dim_s: dict[str, float] = {}
    """The step's ``communication`` idle by parallel dimension (``tp``, ``dp``...: ``CommReport.mesh``)."""
    main_calls: dict[str, StepCall] = {}
    """By cause (``host_sync``, ``memcpy``, ``data_loading``, ``cpu_compute``), the one host call under at least
    half that cause's idle in the step, where one is: what names a one-off wait."""


class KernelStat(msgspec.Struct):
    name: str
    count: int
    total_s: float
    share: float


class KernelFacts(msgspec.Struct):
    count: int
    total_s: float
    short_kernel_share: float
    """Share of kernel time spent in kernels shorter than 10 µs."""
    short_kernel_count: int
    reduced_precision_gemm_share: float | None
    """Share of GEMM/conv kernel time in tensor-core or fp16/bf16 kernels; None: no GEMMs."""
    gemm_share: float
    """Share of kernel time in GEMM/convolution kernels."""
    conv_share: float
    top: list[KernelStat]
    syncs_per_step: float
    item_calls_per_step: float
    pageable_htod_copies: int
    pageable_htod_bytes: int
    median_launch_us: float | None
    pageable_copy_s: float = 0.0
    """Device time of copies from or to pageable host memory with no kernel running beside them, in the window:
    what pinning that memory can shorten."""
    pageable_copy_gbps: float | None = None
    """Those copies' bandwidth, their bytes over their device time (GB/s); None where no bytes are recorded."""
    cast_kernel_count: int = 0
    """Kernels launched inside a dtype-converting operator (``aten::_to_copy``, ``aten::to``): casts, autocast's
    re-casts of the same fp32 weights at every use among them."""
    cast_kernel_s: float = 0.0
    """Their device time in the window."""


class CollectiveStat(msgspec.Struct):
    """One collective type, process group and message-size bucket (``unknown``: size not recorded)."""

    collective: str
    process_group: str
    size_bucket: str
    count: int
    total_s: float
    bytes: int
    """Sum of message bytes where known."""
    algbw_gbps: float | None
    busbw_gbps: float | None
    dtype: str = "unknown"
    """Element type on the wire (``float32``, ``bfloat16``, ``int8``...), from ``record_param_comms``, the
    ``nccl:*`` range or the kernel name; ``unknown`` where none says."""


COMM_ROLES = ("param_all_gather_forward", "param_all_gather_backward", "param_all_gather_optimizer",
              "grad_reduce_scatter", "replicate_all_reduce", "grad_all_reduce", "other")
"""What a collective is for in data-parallel training: parameters gathered before a layer's forward or
backward (sharded: FSDP2, ZeRO-3) or after the optimizer step (ZeRO-1/2), gradients reduce-scattered
(sharded), the all-reduce across replicas of HSDP, the gradient all-reduce of DDP (and ZeRO-1/2 without
partitioned gradients), anything else."""
PARALLELISM = ("ddp", "fsdp2", "deepspeed_zero1_2", "deepspeed_zero3", "deepspeed", "tensor_parallel", "unknown")
"""The data-parallel style a trace or tracker shows: DDP, FSDP2 (``fully_shard``), DeepSpeed ZeRO stage 3,
stage 1 or 2 (the trace cannot tell them apart), DeepSpeed with no ZeRO range seen, or none recognised."""


class CommRole(msgspec.Struct):
    """The collectives of one role (:data:`COMM_ROLES`) and how much of their time no compute hid."""

    role: str
    count: int
    comm_s: float
    exposed_s: float
    """Their time with no compute beside it (where two collectives overlap, the earlier one's)."""
    bytes: int
    """Sum of message bytes where known."""


class CommReport(msgspec.Struct):
    comm_s: float
    """Union of collective kernel time."""
    exposed_s: float
    """Collective time with no compute running."""
    overlap_ratio: float | None
    """Compute kernels during communication / communication time (HTA's definition: no copies, no sets)."""
    collectives: list[CollectiveStat]
    per_step_count: float
    size_histogram: dict[str, int]
    overlap_ratio_with_copies: float | None = None
    """As ``overlap_ratio``, copies and sets counted as compute: ``1 - exposed / comm``."""
    parallelism: str = "unknown"
    """One of :data:`PARALLELISM`, from the trace's own labels (or the tracker's hook)."""
    roles: list[CommRole] = []
    """Communication split by role; the roles' ``exposed_s`` add up to ``exposed_s``. Empty: not split."""
    settings: dict[str, str] = {}
    """The framework's communication settings where the step tracker read them (a DeepSpeed engine's
    ``overlap_comm``, ``reduce_bucket_size``, ...); empty for traces, which do not hold them."""
    mesh: list[MeshDim] = []
    """The job's parallel dimensions as this rank's collectives and process groups show them, outermost first;
    their ``exposed_s`` add up to the rank's ``communication`` idle. Empty: no collective and no group named."""


class StartupCost(msgspec.Struct):
    """A one-time cost: context creation, module loading on a first launch, first allocations, stream
    creation, compilation, a CUDA graph's capture. Shown once; left out of per-step figures and gains."""

    kind: str
    """``context``, ``module_load``, ``allocation``, ``stream``, ``compile``, ``graph_capture``."""
    name: str
    """The call, e.g. ``cudaFree``, ``cudaLaunchKernel (first launch of volta_sgemm_128x64_nn)``."""
    start_s: float
    dur_s: float
    idle_s: float
    """Device idle under it, inside the window (what per-step figures leave out)."""


class Workload(msgspec.Struct):
    """What kind of program the trace shows, from its operator and runtime names."""

    mode: str
    """``training`` (backward or optimizer ops) or ``inference``."""
    execution: str
    """``eager``, ``compiled`` (torch.compile regions, Triton kernels) or ``cuda_graphs`` (graph launches)."""
    engine: str | None = None
    """A serving engine named in the trace: ``vllm``, ``sglang``."""
    libraries: list[str] = msgspec.field(default_factory=list)
    """The libraries the trace's names show: ``torchrec``, ``moe`` (a mixture-of-experts model), ``megatron``,
    ``deepspeed``."""


class PythonHotspot(msgspec.Struct):
    function: str
    idle_s: float
    """Device idle per window while this was the innermost Python function and no operator ran."""


class SyncSource(msgspec.Struct):
    """A function of the user's program the host waited on the GPU from (``host_sync``)."""

    function: str
    """As the trace's Python stacks name it: ``train.py(42): check`` (file, the line the function starts on, name)."""
    idle_s: float
    """Device idle per window while the host waited in a call made inside this function."""
    share: float
    """Of the rank's ``host_sync`` idle."""


class RankReport(msgspec.Struct):
    rank: int
    path: str
    notes: list[str]
    step_source: str
    window: Window
    devices: list[DeviceReport]
    steps: list[StepReport]
    kernels: KernelFacts
    communication: CommReport
    world_size: int | None = None
    backend: str | None = None
    """The process group's backend where the trace records it (Kineto ``distributedInfo.backend``)."""
    host_events: dict[str, int] | None = None
    """What the trace recorded on the host: ``cpu_ops``, ``runtime_calls``, ``linked_launches``,
    ``graph_or_driver_launches``, ``python_functions``, ``launch_calls``, ``launch_call_s`` (µs summed, as an
    int); None for step timing (the tracker)."""
    startup: list[StartupCost] = []
    """One-time costs found in the window, each shown once; their idle is in no step and no gain."""
    workload: Workload | None = None
    """Training or inference, eager or compiled or graph-replaying, and the serving engine: what fixes fit."""
    python_hotspots: list[PythonHotspot] = []
    """Where the Python stacks (``with_stack=True``) put the host during idle with no operator running."""
    sync_sources: list[SyncSource] = []
    """Where the Python stacks put the host's waits on the GPU (``host_sync``), largest first."""
    unmeasured: list[str] = []
    """What this run could not measure, said in the headline, its first fix how to measure it: ``data_loading``
    (a Keras fit not given ``callback.dataset``: its time counts as busy), ``host_activity`` (a trace of device
    events alone: its idle has no cause)."""
    quality: list[TraceQuality] = []
    """What this rank's trace cannot tell (:mod:`gpuidle.analysis.trace_quality`), gathered in
    :attr:`AnalysisReport.quality`."""

    def primary(self) -> DeviceReport:
        """The device this rank trains on: the one with the most busy time."""
        return max(self.devices, key=lambda d: (d.busy_s, -d.device))


class Straggler(msgspec.Struct):
    rank: int
    steps: list[int]
    lateness_s: float
    """Mean over ``steps`` of how long the others waited for this rank (summed over a step's collectives)."""
    score: float
    """Median step time of this rank / fastest rank's median (NVRx-style)."""
    cause: str
    why: str
    score_low: float | None = None
    score_high: float | None = None
    """95 % interval of the per-step score (own step time / the fastest other rank's, same step)."""


class RankRow(msgspec.Struct):
    rank: int
    step_s: float
    utilization: float
    top_cause: str
    own_step_s: float = 0.0
    """``step_s`` less the rank's wait for the others (``straggler_wait``): the step a fix on this rank
    shortens, and the one its gain starts from."""


class JobCommunication(msgspec.Struct):
    exposed_s: float
    """Idle charged to ``communication``, summed over the ranks."""
    straggler_wait_s: float
    """Idle charged to ``straggler_wait``, summed over the ranks."""
    overlap_ratio: float | None
    collectives: list[CollectiveStat]
    parallelism: str = "unknown"
    """The ranks' :attr:`CommReport.parallelism` (the most common one)."""
    roles: list[CommRole] = []
    """The ranks' roles summed."""
    collective_exposed_s: float = 0.0
    """Collective time with no compute beside it, summed over the ranks' :attr:`CommReport.exposed_s`: the
    roles' ``exposed_s`` add up to it."""
    mesh: list[MeshDim] = []
    """The ranks' dimensions (:attr:`CommReport.mesh`) merged: each one's size and source as most ranks show them,
    its counts and times summed over the ranks (``exposed_s`` adds up to ``exposed_s`` above)."""


class JobStep(msgspec.Struct):
    step: int
    skew: float | None
    """Max / median of this step's duration across ranks."""
    last_rank: int | None
    """The rank the others waited for longest in this step's collectives; None: nobody waited."""
    lateness_s: float
    """How long the others waited for ``last_rank`` in this step, summed over its collectives."""


MISSING_LISTED = 4096
"""The most missing ranks a job lists (the lowest): 2 traces of a 200,000-rank job would list 199,998."""


def missing_ranks(world: int | None, found: list[int]) -> list[int]:
    """The lowest :data:`MISSING_LISTED` of the world's ranks with no trace (none without a world)."""
    return sorted(set(range(world)) - set(found))[:MISSING_LISTED] if world else []


class JobReport(msgspec.Struct):
    world_size: int | None
    ranks_found: list[int]
    missing_ranks: list[int]
    """The lowest of the world's ranks with no trace, at most :data:`MISSING_LISTED` (all of them before schema minor
    15); :meth:`missing_count` counts them all."""
    duplicate_ranks: list[int]
    step_skew: float | None
    """Max / median of per-rank mean step time."""
    rank_table: list[RankRow]
    stragglers: list[Straggler]
    communication: JobCommunication
    notes: list[str]
    steps: list[JobStep] = []

    def missing_count(self) -> int:
        """The world's ranks with no trace, every one (the list holds the lowest of them)."""
        if not self.world_size:
            return len(self.missing_ranks)
        return self.world_size - len({r for r in self.ranks_found if 0 <= r < self.world_size})


class Source(msgspec.Struct):
    paths: list[str]
    format: str
    skipped: list[str] = []
    framework: str | None = None
    """``pytorch``, ``jax``, ``tensorflow``, ``cuda`` (a plain CUDA application), ... where the input tells;
    the fixes are phrased for it."""


class AnalysisReport(JsonStruct, kw_only=True):
    schema: str = SCHEMA
    schema_minor: int = SCHEMA_MINOR
    source: Source
    ranks: list[RankReport]
    job: JobReport | None = None
    recommendations: list[Recommendation]
    cost: CostResult | None = None
    """Present when a price per GPU-hour was given."""
    combined: Combined | None = None
    declined: list[Declined] = msgspec.field(default_factory=list)
    """The fixes measured but not offered, each with the precondition that failed (``--explain``)."""
    include_warmup: bool = False
    quality: list[TraceQuality] = msgspec.field(default_factory=list)
    """What the input can and cannot tell, each with the recording change that would help: printed above the
    fixes, never one of them."""
    """True: steps marked ``excluded`` still count in per-step figures and gains (``--include-warmup``)."""
    scale_out: ScaleOut | None = None
    """The job at more GPUs (``--scale-to N``); absent otherwise."""
    host_side: list[HostSide] = msgspec.field(default_factory=list)
    """Ranks whose traces lost every device record, reported from their host side alone: in no figure of
    :attr:`ranks` nor of the job, and a report that has them is incomplete (``gpuidle analyze`` exits 1)."""

    def utilization(self) -> float:
        """The run's utilization, one definition for every command: the mean over the traced ranks of each rank's
        training device's busy / window (each GPU counts once, as each runs the job's hours)."""
        if not self.ranks:
            return 0.0
        return sum(r.primary().utilization for r in self.ranks) / len(self.ranks)

    def __post_init__(self) -> None:
        """A report written before minor 8 held start-up inside ``window_s``: read with today's meaning."""
        if self.schema_minor < WINDOW_LESS_STARTUP:
            for rank in self.ranks:
                for d in rank.devices:
                    d.window_s = max(d.window_s - d.startup_s, 0.0)
            self.schema_minor = SCHEMA_MINOR


# ----------------------------------------------------------------------------------
# Where idle time lies (plots, annotated traces) and before/after comparisons.
# ----------------------------------------------------------------------------------


class DeviceTimeline(msgspec.Struct, frozen=True):
    """One device's idle intervals, by cause, for plots and annotated traces. Times in ns from ``t0_ns``."""

    device: int
    name: str | None
    window: tuple[int, int]
    seg_start: I64
    seg_end: I64
    seg_cause: I64
    """Index into :data:`CAUSES`."""
    seg_step: I64
    """The step number each segment lies in (segments never cross a step boundary)."""
    step_numbers: I64
    step_bounds: I64
    """This device's own steps, as :attr:`IdleTimeline.step_bounds`: where the devices run their steps apart
    (``Timeline.device_steps``), each device's, so its figures are those of the report's device."""
    bin_edges: I64
    """Equal slices of the window, ``n + 1`` edges, for a utilization-over-time plot."""
    bin_busy: npt.NDArray[np.float64]
    """Busy share of each slice."""
    bin_idle: npt.NDArray[np.float64]
    """Idle share of each slice by cause: shape ``(n, len(CAUSES))``; a row plus its busy share is 1."""

    def __len__(self) -> int:
        return int(self.seg_start.shape[0])


class IdleTimeline(msgspec.Struct, frozen=True):
    """The idle intervals of every device of one trace file."""

    path: str
    rank: int
    t0_ns: int
    """Trace clock of time zero, in ns: add it back to write the trace's own timestamps."""
    step_numbers: I64
    step_bounds: I64
    """The rank's steps (the busiest device's, where the devices run theirs apart): step ``i`` is
    ``[step_bounds[i], step_bounds[i + 1])``; the last bound is the window end."""
    devices: list[DeviceTimeline]
    note: str | None = None
    """Why this trace was chosen, when it stands for a job."""
