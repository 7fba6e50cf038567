"""The framework-neutral part of every step tracker: finished steps in, logs, exchange and summary out.

A framework's tracker (PyTorch: :mod:`.core`; JAX: :mod:`.jax_tracker`; Keras:
:mod:`.keras_callback`) times its steps its own way and hands each finished step here as a
row (:class:`~.exchange.RowLayout`). :class:`TrackerBase` keeps the rows, exchanges them
across ranks every ``every`` steps where the framework offers a way (a ``gather``), else each
rank keeps its own and ``gpuidle analyze <out_dir>`` merges the folder; it appends them to
``rank-<r>.jsonl``, logs rank 0's line, feeds the Prometheus series and, at the end, writes the
job summary and its ledger record (:mod:`.output`). It imports no framework.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from gpuidle.analysis.series import rank_stats
from gpuidle.errors import GpuidleError
from gpuidle.live.exporter import node_name
from gpuidle.model import TRACKER_FORMAT, TRACKER_LOG, TRACKER_OTHER, StepSeries, TrackerEnd, TrackerHeader

from . import output
from .exchange import Gather, JobInfo, JobMemory, RowLayout, alone, gather_steps
from .metrics import RECENT_STEPS, MetricsServer

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

NOT_EXCHANGED_NOTE = ("the ranks did not exchange their steps: rank 0's summary covers itself only; "
                      "gpuidle analyze {out_dir} merges every rank's log into the job view")


class TrackerBase:
    """Rows of finished steps on this rank: kept, exchanged, written, summarised (see the module docstring).

    Subclasses set :attr:`_step` (steps ended) and append rows of :attr:`_rows_layout` to :attr:`_rows`.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], *, framework: str, timing: str, rank: int, world_size: int,
        gather: Gather | None, hosts: Sequence[str] | None, phases: Sequence[str], compute_phases: Sequence[str],
        copy_phase: str, every: int, log_every: int | None, notes: list[str], clock: Callable[[], int],
        log: Callable[[str], None] | None, summary_steps: int, label: str | None,
        ledger: str | os.PathLike[str] | bool, prometheus_port: int | None, prometheus_addr: str,
        device: int = 0, device_name: str | None = None,
        process_groups: Sequence[Sequence[dict[str, Any]]] = (),
    ) -> None:
        if every < 1 or (log_every is not None and log_every < 1):
            raise GpuidleError(f"every={every}, log_every={log_every}", "every and log_every must be at least 1")
        if not 0 <= rank < world_size:
            raise GpuidleError(f"rank {rank} of world size {world_size}", "a rank is from 0 to the world size - 1")
        self.rank, self.world_size, self.timing = rank, world_size, timing
        self._label, self._ledger, self._clock = label, ledger, clock
        self._t0 = clock()
        self._every, self._log_every = every, log_every
        self._phases = list(dict.fromkeys(p for p in phases if p != TRACKER_OTHER))
        self._compute, self._copy = list(compute_phases), copy_phase
        self._log = log or output.stderr
        self._gather: Gather = gather if gather is not None else alone
        if world_size > 1 and gather is None:
            notes.append(NOT_EXCHANGED_NOTE.format(out_dir=out_dir))
        self.out_dir = Path(out_dir)
        self._rows_layout = RowLayout(self._phases, JobInfo(
            world_size=world_size, out_dir=self.out_dir, timing=timing, device=device, device_name=device_name,
            compute_phases=self._compute, copy_phase=copy_phase, framework=framework,
            process_groups=tuple(tuple(g) for g in process_groups)))
        node = node_name()
        self._metrics = MetricsServer(label or self.out_dir.resolve().name, list(hosts or [node] * world_size),
                                      prometheus_port, prometheus_addr) \
            if rank == 0 and prometheus_port is not None else None
        self.prometheus_port = self._metrics.port if self._metrics is not None else None
        """The port rank 0 serves its metrics on until :meth:`close`, None when it serves none."""
        self._step = 0
        self._rows: list[list[float]] = []
        self._sent = 0
        self._job = JobMemory(world_size if gather is not None else 1, self._rows_layout.width, summary_steps)
        self._next_log = log_every or 0
        self._comm_hook: str | None = None
        self._comm_settings: dict[str, str] = {}
        self._closed = False
        self.report: AnalysisReport | None = None
        self._notes = notes
        self._unmeasured: list[str] = []
        self._header_notes = len(notes)
        """The notes written in the log's header; those added later go in its end line."""

        self.out_dir.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            output.remove_stale(self.out_dir, world_size)
        self.path = self.out_dir / TRACKER_LOG.format(rank=rank)
        self._file = output.RankLog(self.path)
        self._file.write([TrackerHeader(
            format=TRACKER_FORMAT, rank=rank, world_size=world_size, timing=timing, device=device,
            device_name=device_name, host=socket.gethostname(), pid=os.getpid(), t0=time.time(),
            phases=[*self._phases, TRACKER_OTHER], compute_phases=self._compute, copy_phase=copy_phase,
            every=every, notes=notes, framework=framework if framework != "pytorch" else None,
            process_groups=list(process_groups[rank]) if rank < len(process_groups) else [],
        )])
        if rank == 0:
            for note in notes:
                self._log(note)
            # numpy loads parts of itself on first use: pay that here, not in the middle of a step
            self._log_line(np.zeros((world_size, 1, self._rows_layout.width + 1)))

    @property
    def steps_done(self) -> int:
        return self._step

    def note(self, text: str) -> None:
        """A note learnt after the log's header was written: in the log's end and the summary."""
        self._notes.append(text)

    def unmeasured(self, cause: str, why: str) -> None:
        """An idle cause this run cannot measure, and why: in the log's end, the headline and the first fix."""
        if cause not in self._unmeasured:
            self._unmeasured.append(cause)
            self.note(why)

    @property
    def clock(self) -> Callable[[], int]:
        """The host clock of the tracker (ns), for callers that measure waits themselves."""
        return self._clock

    def _exchange(self, final: bool, count: int) -> None:
        """Send ``count`` finished steps (all at the end) to every rank, split out the wait for stragglers, write."""
        if final:
            count = len(self._rows)
        elif count <= 0:
            return
        layout = self._rows_layout
        rows = np.array(self._rows[:count], dtype=np.float64).reshape(count, layout.width)
        del self._rows[:count]
        world = self.world_size if self._gather is not alone else 1
        everyone, wait = gather_steps(self._gather, rows, layout, world, final)
        me = self.rank if world > 1 else 0
        mine = everyone[me]
        keep = ~np.isnan(mine[:, 0])
        self._file.write(layout.lines(mine[keep], wait[me][keep]))
        self._sent += count
        if self.rank == 0:
            block = np.concatenate([everyone, wait[:, :, None].astype(np.float64)], axis=2)
            self._job.keep(block)
            if self._metrics is not None:
                recent, ranks = self._job.recent(RECENT_STEPS), range(block.shape[0])
                self._metrics.metrics.update([self._series(r, block[r]) for r in ranks],
                                             [self._series(r, recent[r]) for r in ranks])
            if self._log_every and self._step >= self._next_log and not final:
                self._log(self._log_line(block))
                while self._next_log <= self._step:
                    self._next_log += self._log_every

    def _series(self, i: int, m: np.ndarray, notes: list[str] | None = None) -> StepSeries:
        """The ``i``-th rank of a block (``[n, F + 1]``, the wait last) as a :class:`StepSeries`."""
        rank = i if self._gather is not alone else self.rank
        return self._rows_layout.series(m, rank, self._comm_hook, notes if notes is not None else [],
                                        self._comm_settings)

    def _log_line(self, block: np.ndarray) -> str:
        """``step 1200 | 212 ms | GPU busy 61 % | data wait 31 % (rank 3: 48 %) | straggler: rank 3 ×1.4``."""
        stats = rank_stats([self._series(r, block[r]) for r in range(block.shape[0])])
        return output.log_line(self._step, stats, self.timing == "device", self._comm_hook is not None,
                               self._unmeasured)

    def _conclude(self, notes: list[str]) -> AnalysisReport | None:
        """Exchange the last steps, write the end of the log and (rank 0) the job summary; stop the metrics."""
        self._exchange(final=True, count=0)
        self._finish(notes)
        if self.rank == 0 and not len(self._job):
            self._log(f"no step was recorded: no job summary in {self.out_dir}")
        elif self.rank == 0:
            try:
                self.report = self._summarize()
            except Exception as err:  # the end of a long run is no place to crash: the logs are complete
                self._log(f"no job summary ({type(err).__name__}: {err}); the rank logs are complete: "
                          f"gpuidle analyze {self.out_dir}")
        if self._metrics is not None:
            self._metrics.close()
        return self.report

    def _abandon(self, why: str) -> None:
        """Write the steps read so far without a straggler split: another rank may be gone, so no exchange."""
        layout = self._rows_layout
        rows = np.array(self._rows, dtype=np.float64).reshape(len(self._rows), layout.width)
        self._rows.clear()
        self._file.write(layout.lines(rows))
        if self._metrics is not None:
            self._metrics.close()
        self._finish([f"closed by {why}: steps after the last exchange have no straggler split"])

    def _finish(self, notes: list[str]) -> None:
        self._file.write([TrackerEnd(steps=self._step, comm_hook=self._comm_hook, comm_settings=self._comm_settings,
                                     notes=[*self._notes[self._header_notes:], *notes],
                                     unmeasured=list(self._unmeasured))])
        self._file.close()
        self._notes.extend(notes)

    def _summarize(self) -> AnalysisReport:
        job = self._job.steps()
        notes = list(self._notes)
        if self._job.dropped:
            notes.append(f"the job summary covers the last {job.shape[1]} steps of {job.shape[1] + self._job.dropped}; "
                         f"gpuidle analyze {self.out_dir} reads every step from the rank logs")
        series = [msgspec.structs.replace(self._series(r, job[r], notes), unmeasured=list(self._unmeasured))
                  for r in range(job.shape[0])]
        ledger = self._ledger if isinstance(self._ledger, bool) else Path(self._ledger)
        return output.summarize(series, self.out_dir, self._log, self._label, ledger)
