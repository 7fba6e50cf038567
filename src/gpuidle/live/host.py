"""The host probe: per-core CPU busy, host memory, disk reads and the wrapped command's process tree (psutil);
the CPU the host lends (cgroup quota and throttling, frequency, steal) from :mod:`gpuidle.live.cpu_throttle`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuidle.errors import GpuidleError
from gpuidle.live.cpu_throttle import CpuThrottleProbe
from gpuidle.model import HostSample

MIB = 1 << 20


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

    def __init__(self, root_pid: int | None = None, cpu_limits: CpuThrottleProbe | None = None) -> None:
        self._ps = _psutil()
        self._limits = cpu_limits or CpuThrottleProbe()
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
        self._limits.fill(s, self.root_pid)
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
