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
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import msgspec

from gpuidle.errors import GpuidleError
from gpuidle.model import (
    MONITOR_FORMAT,
    GpuInfo,
    GpuSample,
    HostSample,
    MonitorEnd,
    MonitorHeader,
    MonitorSample,
)

MIB = 1 << 20
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


def _psutil() -> Any:
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        raise GpuidleError("psutil is not installed", "pip install 'gpuidle[nvml]'") from None
    return psutil


def cpu_busy_pct(before: Sequence[Any], after: Sequence[Any]) -> list[float]:
    """Per-core % busy between two ``psutil.cpu_times(percpu=True)`` readings.

    As psutil's ``cpu_percent``: busy = total - idle - iowait, where total leaves out
    guest time (already counted in user time on Linux).
    """
    out = []
    for a, b in zip(before, after, strict=False):
        ta, tb = _total(a), _total(b)
        busy = (tb - _idle(b)) - (ta - _idle(a))
        span = tb - ta
        out.append(round(min(max(busy / span * 100.0, 0.0), 100.0), 1) if span > 0 else 0.0)
    return out


def _total(t: Any) -> float:
    total = float(sum(t))
    return total - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _idle(t: Any) -> float:
    return float(t.idle) + float(getattr(t, "iowait", 0.0))


@dataclass(slots=True)
class _Tree:
    refreshed: float = float("-inf")
    members: dict[int, Any] = field(default_factory=dict)
    """pid -> psutil.Process."""
    cpu: dict[int, float] = field(default_factory=dict)
    """pid -> CPU seconds at the previous full sample."""
    last_t: float | None = None


class PsutilHost:
    """Per-core CPU, host memory, disk reads, and the CPU and memory of one process tree."""

    TREE_REFRESH_S = 2.0
    """Finding a tree's members scans every process: do it at most this often."""

    def __init__(self, root_pid: int | None = None) -> None:
        self._ps = _psutil()
        self.root_pid = root_pid
        self._cpu_before = self._ps.cpu_times(percpu=True)
        self._disk: tuple[float, float] | None = None
        self._tree = _Tree()

    def cores(self) -> int:
        return len(self._cpu_before)

    def sample(self, t: float, full: bool) -> HostSample:
        now = self._ps.cpu_times(percpu=True)
        s = HostSample(cpu_pct=cpu_busy_pct(self._cpu_before, now))
        self._cpu_before = now
        if not full:
            return s
        vm = self._ps.virtual_memory()
        s.mem_total_mib = vm.total / MIB
        s.mem_used_mib = (vm.total - vm.available) / MIB
        s.disk_read_mib_s = self._disk_rate(t)
        if self.root_pid is not None:
            self._tree_sample(t, s)
        return s

    def _disk_rate(self, t: float) -> float | None:
        try:
            io = self._ps.disk_io_counters()
        except (OSError, RuntimeError):
            io = None
        if io is None:
            return None
        prev, self._disk = self._disk, (t, float(io.read_bytes))
        if prev is None or t <= prev[0] or io.read_bytes < prev[1]:
            return None
        return (float(io.read_bytes) - prev[1]) / MIB / (t - prev[0])

    def tree_pids(self) -> set[int]:
        return set(self._tree.members)

    def _tree_sample(self, t: float, s: HostSample) -> None:
        ps, tree, root_pid = self._ps, self._tree, self.root_pid
        if root_pid is None:
            return
        if t - tree.refreshed >= self.TREE_REFRESH_S or not tree.members:
            tree.refreshed = t
            try:
                root = tree.members.get(root_pid) or ps.Process(root_pid)
                kids = root.children(recursive=True)
            except (ps.NoSuchProcess, ps.AccessDenied):
                root, kids = None, []
            found = {p.pid: p for p in ([root] if root is not None else []) + kids}
            tree.members = {pid: tree.members.get(pid, p) for pid, p in found.items()}
        cpu: dict[int, float] = {}
        rss = 0.0
        for pid, p in list(tree.members.items()):
            try:
                with p.oneshot():
                    ct = p.cpu_times()
                    cpu[pid] = ct.user + ct.system
                    rss += p.memory_info().rss
            except (ps.NoSuchProcess, ps.AccessDenied, ProcessLookupError):
                tree.members.pop(pid, None)
        if tree.last_t is not None and t > tree.last_t:
            used = sum(c - tree.cpu[pid] for pid, c in cpu.items() if pid in tree.cpu)
            s.proc_cpu_pct = round(max(used, 0.0) / (t - tree.last_t) * 100.0, 1)
        tree.cpu, tree.last_t = cpu, t
        s.proc_rss_mib = rss / MIB if cpu else None
        s.procs = len(cpu)


# ----------------------------------------------------------------------------------
# DCGM profiling fields: dcgm-exporter or `dcgmi dmon`
# ----------------------------------------------------------------------------------

DCGM_EXPORTER_FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}
DCGMI_FIELD_IDS = {1002: "sm_active", 1003: "sm_occupancy", 1004: "tensor_active", 1005: "dram_active"}
DCGMI_COLUMNS = {"SMACT": "sm_active", "SMOCC": "sm_occupancy", "TENSO": "tensor_active", "DRAMA": "dram_active"}
"""The short column names ``dcgmi dmon`` prints for fields 1002-1005."""

_PROM_LINE = re.compile(r'^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_PROM_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

DcgmValues = dict[int, dict[str, float]]
"""GPU index -> {``sm_active``: 0.42, ...}."""


def parse_dcgm_exporter(text: str) -> DcgmValues:
    """The four profiling fields per GPU from dcgm-exporter's Prometheus text."""
    out: DcgmValues = {}
    for line in text.splitlines():
        if not line.startswith("DCGM_FI_PROF_"):
            continue
        m = _PROM_LINE.match(line)
        if not m or m["name"] not in DCGM_EXPORTER_FIELDS:
            continue
        labels = dict(_PROM_LABEL.findall(m["labels"] or ""))
        try:
            gpu, value = int(labels["gpu"]), float(m["value"])
        except (KeyError, ValueError):
            continue
        out.setdefault(gpu, {})[DCGM_EXPORTER_FIELDS[m["name"]]] = value
    return out


class DcgmiParser:
    """``dcgmi dmon -e 1002,1003,1004,1005`` output, one line at a time.

    The tool prints a header (``#Entity   SMACT  SMOCC ...``), a unit line (``ID``), then
    ``GPU 0   0.512  0.301 ...`` per GPU per interval; ``N/A`` when a field is missing.
    """

    def __init__(self) -> None:
        self.columns: list[str] = []

    def feed(self, line: str) -> tuple[int, dict[str, float]] | None:
        parts = line.split()
        if not parts:
            return None
        if parts[0].startswith("#"):
            names = [p for p in (parts[0][1:], *parts[1:]) if p and p != "Entity"]
            self.columns = [DCGMI_COLUMNS.get(n, n) for n in names]
            return None
        if parts[0] != "GPU" or len(parts) < 2 or not parts[1].isdigit():
            return None
        values: dict[str, float] = {}
        for name, raw in zip(self.columns, parts[2:], strict=False):
            if name in DCGMI_COLUMNS.values():
                try:
                    values[name] = float(raw)
                except ValueError:
                    continue
        return int(parts[1]), values


class DcgmReader:
    """Keeps the latest profiling values per GPU, read in a thread of its own.

    The sampler takes each reading once (:meth:`take`), so a value appears in the log
    at the first sample after it was read, and no stale value repeats.
    """

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.error: str | None = None
        self._lock = threading.Lock()
        self._fresh: DcgmValues = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def put(self, values: DcgmValues) -> None:
        with self._lock:
            for gpu, v in values.items():
                self._fresh.setdefault(gpu, {}).update(v)

    def take(self) -> DcgmValues:
        with self._lock:
            out, self._fresh = self._fresh, {}
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuidle-dcgm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class DcgmExporterReader(DcgmReader):
    """Scrapes a dcgm-exporter endpoint (``http://host:9400/metrics``) every ``period_s``."""

    def __init__(self, url: str, period_s: float = 1.0) -> None:
        super().__init__(period_s)
        self.url = url

    def scrape(self) -> DcgmValues:
        try:
            with urllib.request.urlopen(self.url, timeout=min(self.period_s, 2.0)) as r:
                return parse_dcgm_exporter(r.read().decode("utf-8", errors="replace"))
        except (urllib.error.URLError, OSError, ValueError) as err:
            self.error = f"dcgm-exporter at {self.url}: {err}"
            return {}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.put(self.scrape())
            self._stop.wait(self.period_s)


class DcgmiReader(DcgmReader):
    """Runs ``dcgmi dmon`` and reads its lines as they come."""

    def __init__(self, period_s: float = 1.0, exe: str = "dcgmi") -> None:
        super().__init__(period_s)
        self.exe = exe
        self._proc: subprocess.Popen[str] | None = None

    def _run(self) -> None:
        fields = ",".join(str(f) for f in DCGMI_FIELD_IDS)
        cmd = [self.exe, "dmon", "-e", fields, "-d", str(max(int(self.period_s * 1000), 100))]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          stdin=subprocess.DEVNULL)
        except OSError as err:
            self.error = f"dcgmi: {err}"
            return
        parser = DcgmiParser()
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if self._stop.is_set():
                break
            got = parser.feed(line)
            if got is not None:
                self.put({got[0]: got[1]})
            elif "error" in line.lower():
                self.error = f"dcgmi dmon: {line.strip()}"
        if self._proc.poll() is None:
            self._proc.terminate()

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        super().stop()


def dcgm_reader(url: str | None, use_dcgmi: bool = True) -> DcgmReader | None:
    """dcgm-exporter when a URL is given, else ``dcgmi dmon`` when it is on PATH, else nothing."""
    if url:
        return DcgmExporterReader(url)
    exe = shutil.which("dcgmi") if use_dcgmi else None
    return DcgmiReader(exe=exe) if exe else None


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
