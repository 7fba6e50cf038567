"""The CPU the host lends a run (cgroup quota and throttling v1/v2, core frequency, steal), read from fake ``/sys``
and ``/proc`` trees, summarised from the log, tied to data-loading idle, and reported by ``gpuidle run``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuidle.advice.utilization import recommend
from gpuidle.analysis.utilization import analyze
from gpuidle.cli import live as cli_live
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.live.cpu_throttle import CpuThrottleProbe, read_cgroup, read_freq_pct, read_steal
from gpuidle.live.host import PsutilHost
from gpuidle.model import GpuSample, HostSample, MonitorHeader, MonitorSample, util_series_from_records


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def v2_tree(tmp_path: Path, throttled: int = 0, periods: int = 0, usec: int = 0, limit: str = "400000 100000",
            own: str = "/kubepods/job") -> tuple[Path, Path]:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    write(proc_root, "self/cgroup", f"0::{own}\n")
    write(sys_root, f"fs/cgroup{own}/cpu.max", limit + "\n")
    write(sys_root, f"fs/cgroup{own}/cpu.stat",
          f"usage_usec 1000\nuser_usec 800\nsystem_usec 200\nnr_periods {periods}\nnr_throttled {throttled}\n"
          f"throttled_usec {usec}\n")
    return sys_root, proc_root


def test_cgroup_v2_quota_and_throttling(tmp_path: Path) -> None:
    sys_root, proc_root = v2_tree(tmp_path, throttled=23, periods=100, usec=4_500_000)
    cg = read_cgroup(sys_root, proc_root)
    assert cg is not None
    assert (cg.version, cg.quota_cpus, cg.periods, cg.throttled, cg.throttled_s) == (2, 4.0, 100, 23, 4.5)


def test_cgroup_v2_without_a_quota(tmp_path: Path) -> None:
    sys_root, proc_root = v2_tree(tmp_path, limit="max 100000")
    cg = read_cgroup(sys_root, proc_root)
    assert cg is not None
    assert cg.quota_cpus is None
    assert cg.version == 2


def test_cgroup_v2_seen_from_inside_a_container(tmp_path: Path) -> None:
    """The host's path in /proc/self/cgroup, the container's own cgroup mounted as the root."""
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    write(proc_root, "self/cgroup", "0::/docker/abc123\n")
    write(sys_root, "fs/cgroup/cpu.max", "150000 100000\n")
    write(sys_root, "fs/cgroup/cpu.stat", "nr_periods 10\nnr_throttled 2\nthrottled_usec 30\n")
    cg = read_cgroup(sys_root, proc_root)
    assert cg is not None
    assert cg.quota_cpus == 1.5
    assert cg.throttled == 2


def test_cgroup_v1_cpu_cpuacct(tmp_path: Path) -> None:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    write(proc_root, "4242/cgroup", "12:memory:/job\n4:cpu,cpuacct:/slurm/job_7\n0::/\n")
    folder = "fs/cgroup/cpu,cpuacct/slurm/job_7"
    write(sys_root, f"{folder}/cpu.cfs_quota_us", "200000\n")
    write(sys_root, f"{folder}/cpu.cfs_period_us", "100000\n")
    write(sys_root, f"{folder}/cpu.stat", "nr_periods 50\nnr_throttled 5\nthrottled_time 2500000000\n")
    cg = read_cgroup(sys_root, proc_root, 4242)
    assert cg is not None
    assert (cg.version, cg.quota_cpus, cg.periods, cg.throttled, cg.throttled_s) == (1, 2.0, 50, 5, 2.5)
    write(sys_root, f"{folder}/cpu.cfs_quota_us", "-1\n")
    cg = read_cgroup(sys_root, proc_root, 4242)
    assert cg is not None
    assert cg.quota_cpus is None


def test_nothing_readable_is_none_never_zero(tmp_path: Path) -> None:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    sys_root.mkdir()
    proc_root.mkdir()
    assert read_cgroup(sys_root, proc_root) is None
    assert read_freq_pct(sys_root, proc_root) is None
    assert read_steal(proc_root) is None
    s = HostSample()
    CpuThrottleProbe(sys_root, proc_root).fill(s, None)
    assert (s.cgroup_version, s.cpu_quota, s.cg_throttled, s.cpu_freq_pct, s.cpu_steal_pct) == (None,) * 5


def test_frequency_from_cpufreq_else_cpuinfo(tmp_path: Path) -> None:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    for core, cur in ((0, 1_500_000), (1, 3_000_000)):
        write(sys_root, f"devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq", f"{cur}\n")
        write(sys_root, f"devices/system/cpu/cpu{core}/cpufreq/cpuinfo_max_freq", "3000000\n")
    assert read_freq_pct(sys_root, proc_root) == 75.0
    other = tmp_path / "other"
    write(other, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2650 v4 @ 2.20GHz\n"
                                 "cpu MHz\t\t: 1100.000\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) CPU E5-2650 "
                                 "v4 @ 2.20GHz\ncpu MHz\t\t: 2200.000\n")
    assert read_freq_pct(other / "sys", other / "proc") == 75.0
    write(other, "proc/cpuinfo", "model name\t: Intel(R) Xeon(R) Processor\ncpu MHz\t\t: 2599.998\n")
    assert read_freq_pct(other / "sys", other / "proc") is None


def test_steal_between_two_reads(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    write(proc_root, "stat", "cpu  100 0 100 700 0 0 0 100 0 0\ncpu0 1 0 1 1 0 0 0 1 0 0\n")
    probe = CpuThrottleProbe(tmp_path / "sys", proc_root)
    write(proc_root, "stat", "cpu  200 0 200 1400 0 0 0 200 0 0\n")
    s = HostSample()
    probe.fill(s, None)
    assert s.cpu_steal_pct == 10.0


def samples(cpu: list[tuple[int, int, float]], util: float, cpu_busy: float, quota: float | None = 4.0,
            freq: float | None = 99.0) -> list[MonitorSample]:
    """One sample a second: ``(periods, throttled, held back s)`` per sample, one GPU at ``util``."""
    out = []
    for i, (periods, throttled, held) in enumerate(cpu):
        host = HostSample(cpu_pct=[cpu_busy] * 4, cgroup_version=2, cpu_quota=quota, cg_periods=periods,
                          cg_throttled=throttled, cg_throttled_s=held, cpu_freq_pct=freq, cpu_steal_pct=0.0)
        out.append(MonitorSample(t=1000.0 + i, gpus=[GpuSample(index=0, util_pct=util)], host=host))
    return out


HEADER = MonitorHeader(format="gpuidle.monitor/1", t0=1000.0, interval_s=1.0, cores=4, cpu_limits=True)


def test_throttled_share_of_the_run_in_the_summary() -> None:
    counters = [(1000 + 100 * i, 50 + 23 * i, 1.0 + 0.5 * i) for i in range(11)]
    series = util_series_from_records(HEADER, samples(counters, util=95.0, cpu_busy=60.0))
    a = analyze(series)
    assert a.host is not None
    assert a.host.cpu_limits is not None
    c = a.host.cpu_limits
    assert (c.periods, c.throttled_share, c.throttled_s, c.quota_cpus) == (1000, 0.23, 5.0, 4.0)
    assert c.summary.startswith("throttled 23 % of the run (cgroup quota 4 CPUs, held back 5.0 s)")
    [f] = [f for f in a.findings if f.kind == "cpu_throttled"]
    assert f.cause is None
    assert f.summary == "CPU throttled 23 % of the run (cgroup quota 4 CPUs)"
    [rec] = [r for r in recommend(a) if r.id == "cpu_throttled"]
    assert "allows 4 CPUs" in rec.fix
    assert rec.cause == "compute"


def test_throttling_tied_to_data_loading_idle() -> None:
    counters = [(100 * i, 40 * i, 0.5 * i) for i in range(11)]
    series = util_series_from_records(HEADER, samples(counters, util=20.0, cpu_busy=95.0))
    a = analyze(series)
    kinds = {f.kind: f for f in a.findings}
    assert "input_bound" in kinds
    f = kinds["cpu_throttled"]
    assert f.cause == "data_loading"
    assert f.seconds == kinds["input_bound"].seconds > 0
    assert "the data loading the GPUs waited" in f.summary
    [rec] = [r for r in recommend(a) if r.id == "cpu_throttled"]
    assert rec.title.startswith("The GPUs wait for data loading on a CPU that is held back")
    assert rec.gain.utilization_after is not None
    assert rec.gain.utilization_after > 0.2


def test_no_throttling_no_finding_and_unreadable_said() -> None:
    counters = [(100 * i, 0, 0.0) for i in range(5)]
    series = util_series_from_records(HEADER, samples(counters, util=95.0, cpu_busy=50.0))
    a = analyze(series)
    assert not [f for f in a.findings if f.kind == "cpu_throttled"]
    assert a.host is not None
    assert a.host.cpu_limits is not None
    assert a.host.cpu_limits.summary.startswith("throttled 0 % of the run (cgroup quota 4 CPUs)")
    bare = [MonitorSample(t=1000.0 + i, gpus=[GpuSample(index=0, util_pct=95.0)], host=HostSample(cpu_pct=[50.0]))
            for i in range(5)]
    series = util_series_from_records(HEADER, bare)
    c = analyze(series).host.cpu_limits  # type: ignore[union-attr]
    assert c is not None
    assert c.throttled_share is None
    assert c.freq_pct is None
    assert c.summary == ("CPU quota and throttling not readable here · core frequency not readable here · "
                         "steal time not readable here")
    assert len(c.not_readable) == 3
    older = MonitorHeader(format="gpuidle.monitor/1", t0=1000.0, interval_s=1.0, cores=4)
    assert analyze(util_series_from_records(older, bare)).host.cpu_limits is None  # type: ignore[union-attr]


def test_slow_clocks_are_a_finding() -> None:
    counters = [(0, 0, 0.0)] * 5
    series = util_series_from_records(HEADER, samples(counters, util=95.0, cpu_busy=50.0, quota=None, freq=55.0))
    [f] = [f for f in analyze(series).findings if f.kind == "cpu_throttled"]
    assert f.summary == "CPU cores at 55 % of their maximum clock"


def test_run_reports_the_throttling_the_quota_caused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The command throttles itself halfway (its fake cgroup's counters move), and the summary says by how much."""
    sys_root, proc_root = v2_tree(tmp_path, periods=0, throttled=0, limit="200000 100000")
    stat = sys_root / "fs/cgroup/kubepods/job/cpu.stat"

    def no_gpu() -> None:
        raise GpuidleError("no GPU here")

    monkeypatch.setattr(cli_live, "GPU_BACKEND", no_gpu)
    monkeypatch.setattr(cli_live, "HOST_BACKEND", lambda pid: PsutilHost(pid, CpuThrottleProbe(sys_root, proc_root)))
    log, summary = tmp_path / "run.jsonl", tmp_path / "summary.txt"
    # the command moves its cgroup's counters once a sample is logged, and exits once a sample saw them moved
    code = (f"import pathlib, time\nlog, stat = pathlib.Path({str(log)!r}), pathlib.Path({str(stat)!r})\n"
            "while log.read_text().count('cg_periods') < 1: time.sleep(0.1)\n"
            "stat.write_text('nr_periods 40\\nnr_throttled 10\\nthrottled_usec 900000\\n')\n"
            "while '\"cg_throttled\":10' not in log.read_text(): time.sleep(0.1)\n")
    assert main(["run", "--quiet", "--interval", "0.5", "--no-dcgm", "--no-ledger", "--out", str(log),
                 "--summary", str(summary), "--", sys.executable, "-c", code]) == 0
    text = summary.read_text()
    assert "CPU: throttled 25 % of the run (cgroup quota 2 CPUs, held back 0.9 s)" in text
    assert "CPU throttled 25 % of the run (cgroup quota 2 CPUs)" in text
    hosts = [json.loads(x).get("host") for x in log.read_text().splitlines()]
    assert any(h and h.get("cg_throttled") == 10 for h in hosts)
    assert capsys.readouterr().out == ""
