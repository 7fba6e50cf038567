"""The tracker's numbers as Prometheus metrics, served by rank 0 while the job runs.

``StepTracker(prometheus_port=9401)`` on rank 0 serves ``/metrics`` (bound to 127.0.0.1 unless
``prometheus_addr`` says otherwise), updated at every exchange, one series per rank: the
families of :data:`gpuidle.model.TRACKER_METRICS`, with their labels (``job``, ``rank``,
``Hostname``). The gauges are taken over each rank's last :data:`RECENT_STEPS` steps: the median
step time, the data wait's share of the step time, the mean exposed communication per step
(waiting for a slower rank included) and the straggler score (median own step time ÷ the
fastest rank's); the counter is the idle time per cause since the start. Profiled steps are
left out of all of them, as from the job summary.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuidle.analysis.series import measured, rank_stats, split_steps
from gpuidle.errors import GpuidleError
from gpuidle.model import CAUSES, TRACKER_METRICS, StepSeries

RECENT_STEPS = 100
"""The window of the gauges: each rank's last this many steps."""


@dataclass(frozen=True, slots=True)
class RankGauges:
    """One rank's gauges over its recent steps."""

    step_s: float
    data_wait: float
    exposed_s: float
    score: float


GAUGES = {
    "gpuidle_tracker_step_seconds": "step_s",
    "gpuidle_tracker_data_wait_ratio": "data_wait",
    "gpuidle_tracker_exposed_communication_seconds": "exposed_s",
    "gpuidle_tracker_straggler_score": "score",
}
"""The catalogue's gauges, each with the :class:`RankGauges` field it shows."""
IDLE_BY_CAUSE = "gpuidle_tracker_idle_seconds_total"


class TrackerMetrics:
    """The job's latest gauges and idle counters; updated by the tracker, read by scrapes (a custom collector)."""

    def __init__(self, job: str, hosts: Sequence[str]) -> None:
        self.job = job
        self.hosts = list(hosts)
        self._lock = threading.Lock()
        self._gauges: dict[int, RankGauges] = {}
        self._idle_ns = np.zeros((len(self.hosts), len(CAUSES)), dtype=np.int64)

    def update(self, new: Sequence[StepSeries], recent: Sequence[StepSeries]) -> None:
        """Count the idle by cause of the newly exchanged steps; the gauges from the recent ones (a series per rank)."""
        idle = np.zeros_like(self._idle_ns)
        for s in new:
            s = s.select(~s.profiled)
            if len(s):
                idle[s.rank] = split_steps(s).causes.sum(axis=0)
        gauges = {}
        for st, s in zip(rank_stats(list(recent)), recent, strict=True):
            m = measured(s)
            gauges[st.rank] = RankGauges(step_s=st.step_s, data_wait=st.data_share, score=st.score,
                                         exposed_s=float(m.comm_exposed.mean()) / 1e9 if len(m) else 0.0)
        with self._lock:
            self._idle_ns += idle
            self._gauges = gauges

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            gauges, idle = dict(self._gauges), self._idle_ns.copy()
        for m in TRACKER_METRICS:
            if m.name == IDLE_BY_CAUSE:
                counter = CounterMetricFamily(m.name, m.help, labels=list(m.labels))
                for rank in range(idle.shape[0]):
                    for j, cause in enumerate(CAUSES):
                        counter.add_metric(self._labels(rank, m.labels, cause=cause.value), float(idle[rank, j]) / 1e9)
                yield counter
                continue
            gauge = GaugeMetricFamily(m.name, m.help, labels=list(m.labels))
            for rank in sorted(gauges):
                gauge.add_metric(self._labels(rank, m.labels), float(getattr(gauges[rank], GAUGES[m.name])))
            yield gauge

    def _labels(self, rank: int, names: Sequence[str], **more: str) -> list[str]:
        values = {"job": self.job, "rank": str(rank), "Hostname": self.hosts[rank] if rank < len(self.hosts) else "",
                  **more}
        return [values[n] for n in names]


class MetricsServer:
    """``/metrics`` over HTTP from a daemon thread, serving the job's :class:`TrackerMetrics`."""

    def __init__(self, job: str, hosts: Sequence[str], port: int, addr: str = "127.0.0.1") -> None:
        try:
            import prometheus_client
        except ImportError:
            raise GpuidleError("prometheus-client is not installed", "pip install 'gpuidle[prometheus]'") from None
        self.metrics = TrackerMetrics(job, hosts)
        registry = prometheus_client.CollectorRegistry(auto_describe=False)
        registry.register(self.metrics)
        try:
            self._server, self._thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
        except OSError as err:
            raise GpuidleError(f"cannot serve the tracker's metrics on {addr}:{port}: {err.strerror}",
                               "pick a free port with prometheus_port=") from None
        self._open = True

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=2.0)
