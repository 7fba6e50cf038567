"""The sampler: every device and the host, read together at a fixed interval.

A :class:`Monitor` takes its GPU backend, host probe and clock as arguments, so tests
drive it with recorded samples and a fake clock on a machine without a GPU. One tick
produces one :class:`~gpuidle.model.MonitorSample`; sinks (the JSONL log, the exporter,
the live view) receive it in the sampling thread, so each must be quick.

Cheap counters (utilization, memory, power, per-core CPU) are read at every tick; the
rest (clocks, temperature, throughput, processes, process tree, host memory, disk) at
most once per ``slow_every_s``, which keeps a 100 ms interval near 1 % of one core.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import msgspec

from gpuidle.errors import GpuidleError
from gpuidle.live.dcgm import DcgmReader
from gpuidle.live.host import PsutilHost
from gpuidle.model import (
    MONITOR_FORMAT,
    GpuInfo,
    GpuSample,
    HostSample,
    MonitorEnd,
    MonitorHeader,
    MonitorSample,
)

MIN_INTERVAL_S = 0.1
SLOW_EVERY_S = 1.0
"""Seconds between full samples (clocks, temperature, throughput, processes, host memory and disk)."""


class GpuBackend(Protocol):
    """Where device samples come from: NVML on a real machine, recorded samples in tests."""

    def open(self) -> list[GpuInfo]: ...

    def sample(self, t: float) -> list[GpuSample]: ...

    def close(self) -> None: ...


class HostBackend(Protocol):
    def cores(self) -> int: ...

    def sample(self, t: float, full: bool) -> HostSample: ...


class Clock(Protocol):
    def time(self) -> float:
        """Unix time in seconds, never going backwards within a run."""
        ...

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Sleep up to ``seconds``; True when ``stop`` was set."""
        ...


class SystemClock:
    """Wall time for timestamps, advanced by the monotonic clock so a clock step cannot reorder samples."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def time(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0)

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        return stop.wait(max(seconds, 0.0))


def nvml_backend() -> GpuBackend:
    """The real backend, imported lazily so analysis never needs nvidia-ml-py."""
    from gpuidle.live.nvml import NvmlBackend

    return NvmlBackend()


# ----------------------------------------------------------------------------------
# Host: psutil
# ----------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------
# The sampler
# ----------------------------------------------------------------------------------

Sink = Callable[[MonitorSample], None]


class Monitor:
    """Samples at a fixed interval until stopped; each tick is one :class:`MonitorSample`.

    ``gpu=None`` (or a backend that cannot open) samples the host only and says why in
    the header. ``devices`` keeps only those GPU indices.
    """

    def __init__(
        self,
        gpu: GpuBackend | None,
        host: HostBackend | None = None,
        interval_s: float = 1.0,
        clock: Clock | None = None,
        dcgm: DcgmReader | None = None,
        devices: Sequence[int] | None = None,
        slow_every_s: float = SLOW_EVERY_S,
        command: list[str] | None = None,
    ) -> None:
        if interval_s < MIN_INTERVAL_S - 1e-9:
            raise GpuidleError(f"interval {interval_s} s is below the minimum {MIN_INTERVAL_S} s")
        self.gpu = gpu
        self.host = host
        self.interval_s = interval_s
        self.clock: Clock = clock or SystemClock()
        self.dcgm = dcgm
        self.devices = set(devices) if devices is not None else None
        self.slow_every_s = slow_every_s
        self.command = command
        self.samples = 0
        self.late_ticks = 0
        """Ticks skipped because a sample took longer than the interval."""
        self.header: MonitorHeader | None = None
        self._last_full = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, gpu_unavailable: str | None = None) -> MonitorHeader:
        """Open the backends and describe the run. A GPU backend that fails leaves the host sampled."""
        gpus: list[GpuInfo] = []
        notes: list[str] = []
        if self.gpu is not None:
            try:
                gpus = self.gpu.open()
            except GpuidleError as err:
                gpu_unavailable, self.gpu = str(err), None
        elif gpu_unavailable is None:
            gpu_unavailable = "no GPU backend"
        if self.devices is not None:
            missing = sorted(self.devices - {g.index for g in gpus})
            if missing and self.gpu is not None:
                notes.append(f"devices not found: {missing}")
            gpus = [g for g in gpus if g.index in self.devices]
        if self.dcgm is not None:
            self.dcgm.start()
        self.header = MonitorHeader(
            format=MONITOR_FORMAT, t0=self.clock.time(), interval_s=self.interval_s, gpus=gpus,
            cores=self.host.cores() if self.host is not None else None, command=self.command,
            gpu_unavailable=gpu_unavailable if not gpus else None, notes=notes,
            cpu_limits=isinstance(self.host, PsutilHost),
        )
        return self.header

    def sample(self) -> MonitorSample:
        """One tick: every device and the host, now."""
        t = self.clock.time()
        full = t - self._last_full >= self.slow_every_s - self.interval_s / 2
        if full:
            self._last_full = t
        gpus: list[GpuSample] = []
        if self.gpu is not None:
            gpus = [g for g in self.gpu.sample(t) if self.devices is None or g.index in self.devices]
            if not full:
                for g in gpus:
                    _drop_slow(g)
        if self.dcgm is not None:
            fresh = self.dcgm.take()
            for g in gpus:
                for key, value in fresh.get(g.index, {}).items():
                    setattr(g, key, value)
        host = self.host.sample(t, full) if self.host is not None else None
        self.samples += 1
        return MonitorSample(t=t, gpus=gpus, host=host)

    def run(self, sinks: Sequence[Sink], stop: threading.Event | None = None, max_samples: int | None = None,
            duration_s: float | None = None) -> int:
        """Sample until ``stop`` is set, ``max_samples`` are taken or ``duration_s`` passed; returns the count.

        Ticks stay on the grid ``t0 + k * interval``; a tick that is already late is
        skipped (counted in :attr:`late_ticks`) instead of bunching samples together.
        """
        stop = stop or self._stop
        if self.header is None:
            self.open()
        start = self.clock.time()
        next_t = start
        taken = 0
        while not stop.is_set():
            s = self.sample()
            for sink in sinks:
                sink(s)
            taken += 1
            if max_samples is not None and taken >= max_samples:
                break
            next_t += self.interval_s
            now = self.clock.time()
            if now > next_t:
                behind = int((now - next_t) // self.interval_s) + 1
                self.late_ticks += behind
                next_t += behind * self.interval_s
            if duration_s is not None and next_t - start > duration_s + 1e-9:
                break
            if self.clock.wait(next_t - now, stop):
                break
        return taken

    def start(self, sinks: Sequence[Sink]) -> None:
        """:meth:`run` in a background thread, until :meth:`stop`."""
        if self.header is None:
            self.open()
        self._thread = threading.Thread(target=self.run, args=(sinks, self._stop), name="gpuidle-monitor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.dcgm is not None:
            self.dcgm.stop()
        if self.gpu is not None:
            self.gpu.close()

    def notes(self) -> list[str]:
        out = []
        if self.late_ticks:
            out.append(f"{self.late_ticks} ticks skipped: sampling took longer than the {self.interval_s:g} s interval")
        if self.dcgm is not None and self.dcgm.error:
            out.append(f"DCGM profiling fields unavailable: {self.dcgm.error}")
        return out


_SLOW_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "temp_c", "pcie_rx_mib_s", "pcie_tx_mib_s",
                "nvlink_rx_mib_s", "nvlink_tx_mib_s", "throttle_reasons", "pids", "mem_total_mib")


def _drop_slow(g: GpuSample) -> None:
    """Between full samples only the cheap counters are kept; the rest reads N/A (None)."""
    for key in _SLOW_FIELDS:
        setattr(g, key, None)


# ----------------------------------------------------------------------------------
# The log: one JSON object per line
# ----------------------------------------------------------------------------------


class JsonlWriter:
    """Writes the header, one line per sample, and an end line; flushed about once a second.

    A run that dies still leaves every flushed sample readable: the reader needs no end line.
    """

    FLUSH_EVERY_S = 1.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise GpuidleError(f"{self.path} is a folder", "give a file name for the log, e.g. util.jsonl")
        try:
            self._f: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        except OSError as err:
            raise GpuidleError(f"cannot write {self.path}: {err.strerror}") from None
        self._enc = msgspec.json.Encoder()
        self._flushed = float("-inf")
        self.samples = 0
        self._lock = threading.Lock()

    def header(self, h: MonitorHeader) -> None:
        self._write(h)
        self._f.flush()

    def __call__(self, s: MonitorSample) -> None:
        self._write(s)
        self.samples += 1
        if s.t - self._flushed >= self.FLUSH_EVERY_S:
            self._flushed = s.t
            self._f.flush()

    def close(self, end: MonitorEnd | None = None) -> None:
        with self._lock:
            if self._f.closed:
                return
            if end is not None:
                self._f.write(self._enc.encode(end) + b"\n")
            self._f.close()

    def _write(self, record: Any) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.write(self._enc.encode(record) + b"\n")


def default_log_path(prefix: str = "gpuidle") -> str:
    return os.path.join(os.getcwd(), time.strftime(f"{prefix}-%Y%m%d-%H%M%S.jsonl"))
