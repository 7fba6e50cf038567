"""The ranks' finished steps, exchanged: one ``all_gather`` of numbers every few steps.

Each rank packs its finished steps as rows of floats (:class:`RowLayout`); every ``every``
steps all ranks gather everyone's rows on a gloo group of their own, so NCCL streams and
the GPU are left alone. From the rows each rank learns how long it waited for the slowest
one in each step (:func:`gather_steps`); rank 0 keeps the job's last steps
(:class:`JobMemory`) for the log lines and the job summary.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gpuidle.analysis.series import straggler_split
from gpuidle.errors import GpuidleError
from gpuidle.model import TRACKER_LOG, TRACKER_OTHER, StepSeries, TrackerStep

if TYPE_CHECKING:
    import torch.distributed as dist

Gather = Callable[[np.ndarray], np.ndarray]
"""``rows [n, F]`` of this rank in, ``[world, n, F]`` of every rank out; called by all ranks together."""

TAIL = ("comm", "exposed", "buckets", "bytes", "samples", "batches", "profiled", "sync", "syncs")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What every rank's series shares: the job's size and folder, the timing, the device, the phases' roles."""

    world_size: int
    out_dir: Path
    timing: str
    device: int
    device_name: str | None
    compute_phases: list[str]
    copy_phase: str
    framework: str = "pytorch"
    process_groups: tuple[tuple[dict[str, Any], ...], ...] = ()
    """Each rank's process groups by rank (:attr:`TrackerHeader.process_groups`); empty where not exchanged."""


class RowLayout:
    """The columns of a step's row: times, phases on the host and the device, communication, data."""

    def __init__(self, phases: Sequence[str], info: JobInfo) -> None:
        names = [*phases, TRACKER_OTHER]
        self.names = names
        self.info = info
        self.device_timed = info.timing == "device"
        self.cols = ["step", "start", "dur", "data", *(f"host:{p}" for p in names),
                     *(f"device:{p}" for p in names), *TAIL]
        self.col = {c: i for i, c in enumerate(self.cols)}
        self.host_col = {p: self.col[f"host:{p}"] for p in names}
        self.device_col = {p: self.col[f"device:{p}"] for p in names}
        self.tail = [self.col[c] for c in TAIL]
        self._tail_of = itemgetter(*self.tail)
        self._host_of, self._device_of = _picker(self.host_col.values()), _picker(self.device_col.values())
        self._host_names, self._device_names = list(self.host_col), list(self.device_col)
        self.exposed = self.col["exposed"]
        self.width = len(self.cols)

    def lines(self, rows: np.ndarray, waits: np.ndarray | None = None) -> list[TrackerStep]:
        """Rows and each one's wait for the slowest rank (None: no wait) as the log's step lines.

        Made every ``every`` steps: the block turned to Python ints at once, and each line's phases
        picked with one ``itemgetter``, cost half of reading the rows' numpy scalars one by one.
        """
        ints = rows.astype(np.int64).tolist()
        wait_ns = waits.astype(np.int64).tolist() if waits is not None else [0] * len(ints)
        host_names, host_of = self._host_names, self._host_of
        device_names, device_of = self._device_names, self._device_of
        out = []
        for r, wait in zip(ints, wait_ns, strict=True):
            comm, exposed, buckets, nbytes, samples, batches, profiled, sync, syncs = self._tail_of(r)
            out.append(TrackerStep(
                step=r[0], start_ns=r[1], dur_ns=r[2], data_ns=r[3],
                phases=dict(zip(host_names, host_of(r), strict=True)),
                device_phases=dict(zip(device_names, device_of(r), strict=True)) if self.device_timed else {},
                comm_ns=comm, comm_exposed_ns=exposed, straggler_ns=wait, buckets=buckets, bucket_bytes=nbytes,
                samples=samples, batches=batches, profiled=bool(profiled), sync_ns=sync, syncs=syncs,
            ))
        return out

    def series(self, m: np.ndarray, rank: int, comm_hook: str | None, notes: list[str],
               comm_settings: dict[str, str] | None = None) -> StepSeries:
        """One rank's rows (``[n, F + 1]``, the wait last) as a :class:`StepSeries`."""
        m = m[~np.isnan(m[:, 0])]
        col = self.col

        def c(name: str) -> np.ndarray:
            return m[:, col[name]].astype(np.int64)

        info = self.info
        return StepSeries(
            rank=rank, world_size=info.world_size, path=str(info.out_dir / TRACKER_LOG.format(rank=rank)),
            timing=info.timing, device=info.device, device_name=info.device_name,
            compute_phases=info.compute_phases, copy_phase=info.copy_phase,
            step=c("step"), start=c("start"), dur=c("dur"), data=c("data"),
            phases={p: c(f"host:{p}") for p in self.names},
            device_phases={p: c(f"device:{p}") for p in self.names} if self.device_timed else {},
            comm=c("comm"), comm_exposed=c("exposed"), straggler=m[:, -1].astype(np.int64), buckets=c("buckets"),
            bucket_bytes=c("bytes"), samples=c("samples"), batches=c("batches"),
            profiled=m[:, col["profiled"]] > 0, comm_hook=comm_hook,
            comm_settings=dict(comm_settings or {}), notes=notes, sync=c("sync"), syncs=c("syncs"),
            framework=info.framework,
            process_groups=list(info.process_groups[rank]) if rank < len(info.process_groups) else [],
        )


def _picker(indices: Iterable[int]) -> Callable[[list[int]], tuple[int, ...]]:
    """A row's values at ``indices``, as a tuple also for one index (where ``itemgetter`` gives the value)."""
    index = list(indices)
    if len(index) == 1:
        only = index[0]
        return lambda r: (r[only],)
    return itemgetter(*index)


def gather_steps(gather: Gather, rows: np.ndarray, layout: RowLayout, world_size: int,
                 final: bool) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's rows (``[world, n, F]``, NaN where a rank has fewer) and each rank's wait per step.

    At the end ranks may have finished different numbers of steps: they first agree on the
    most, and pad. A step every rank has is split (:func:`straggler_split`); others wait 0.
    """
    count = rows.shape[0]
    if final and world_size > 1:
        most = int(np.nanmax(gather(np.array([[float(count)]]))))
        rows = np.vstack([rows, np.full((most - count, layout.width), np.nan)])
    everyone = gather(rows)
    full = ~np.isnan(everyone[:, :, 0]).any(axis=0)
    wait = np.zeros(everyone.shape[:2], dtype=np.int64)
    if full.any():
        wait[:, full] = straggler_split(everyone[:, full, layout.exposed].astype(np.int64))
    return everyone, wait


class JobMemory:
    """Rank 0's memory of the job: the last ``limit`` steps of every rank, the wait as a last column."""

    def __init__(self, world_size: int, width: int, limit: int) -> None:
        self._blocks: deque[np.ndarray] = deque()
        self._steps = 0
        self.dropped = 0
        self._limit = max(1, limit)
        self._empty = np.zeros((world_size, 0, width + 1))

    def keep(self, block: np.ndarray) -> None:
        self._blocks.append(block)
        self._steps += block.shape[1]
        while self._steps - self._blocks[0].shape[1] >= self._limit:
            gone = self._blocks.popleft()
            self._steps -= gone.shape[1]
            self.dropped += gone.shape[1]

    def __len__(self) -> int:
        return self._steps

    def steps(self) -> np.ndarray:
        """``[world, n, F + 1]`` of the steps kept."""
        return np.concatenate(self._blocks, axis=1) if self._blocks else self._empty

    def recent(self, n: int) -> np.ndarray:
        """The last ``n`` steps kept (fewer if fewer were)."""
        job = self.steps()
        return job[:, max(0, job.shape[1] - n):]


def alone(rows: np.ndarray) -> np.ndarray:
    return rows[None]


def exchange_group(group: str | dist.ProcessGroup) -> dist.ProcessGroup | None:
    """The group for the exchange: by default a gloo group of its own.

    Gloo, so that NCCL streams and the GPU are left alone. Its own group, also when the
    default group is gloo: sharing it with DDP's all-reduces made processes abort now and
    then in gloo's teardown at exit (torch 2.13, two ranks on one host).
    """
    if not isinstance(group, str):
        return group
    if group == "default":
        return None
    import torch.distributed as dist

    if group in ("auto", "gloo"):
        return cast(dist.ProcessGroup, dist.new_group(backend="gloo"))
    raise GpuidleError(f"group={group!r}", "use 'auto', 'default', 'gloo' or a ProcessGroup")


def dist_gather(group: dist.ProcessGroup | None, world: int) -> Gather:
    """:data:`Gather` over ``torch.distributed``: on the GPU only when the group's backend is not gloo."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    on_gpu = "gloo" not in backend and torch.cuda.is_available()

    def gather(rows: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
        if on_gpu:
            t = t.cuda()
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t, group=group)
        return np.stack([o.cpu().numpy() for o in out])

    return gather


def dist_rank_facts(group: dist.ProcessGroup | None, world: int, host: str, groups: list[dict[str, Any]]
                    ) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """Every rank's node name (the metrics' ``Hostname`` labels) and process groups (its place in the mesh), by
    rank: once, when the tracker starts."""
    import torch.distributed as dist

    facts: list[object] = [None] * world
    dist.all_gather_object(facts, (host, groups), group=group)
    pairs = [f if isinstance(f, tuple) and len(f) == 2 else ("", []) for f in facts]
    return [str(h) for h, _ in pairs], [list(g) if isinstance(g, list) else [] for _, g in pairs]
