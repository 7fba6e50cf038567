"""Nsight Systems inputs end to end: the real export against plain SQL, bad input, ``.nsys-rep``, annotate."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.api import analyze, annotate_trace, idle_timeline
from gpuidle.model import IdleTimeline
from nsysexport import Export

REAL = DATA / "cloverleaf_a100__perlmutter-cloverleaf-cuda.sqlite"
DEVICE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def gpuidle(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuidle: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file of the folder: its SHA-256 and mtime; a journal or WAL written beside would show."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in folder.iterdir() if p.is_file()}


def reference_busy(path: Path, device: int) -> tuple[int, int, int]:
    """Window start, end and busy ns of a device, straight from the tables: union of all its work."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    rows: list[tuple[int, int]] = []
    for table in DEVICE_TABLES:
        if db.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]:
            rows += db.execute(f'SELECT start, "end" FROM {table} WHERE deviceId = ?', (device,)).fetchall()
    db.close()
    rows.sort()
    busy, reach = 0, rows[0][0]
    for s, e in rows:
        if e > reach:
            busy += e - max(s, reach)
            reach = e
    return rows[0][0], max(e for _, e in rows), busy


def test_real_export_busy_idle_against_plain_sql(tmp_path: Path) -> None:
    copy = tmp_path / REAL.name
    shutil.copy(REAL, copy)
    before = fingerprint(tmp_path)
    report = analyze([copy])
    assert fingerprint(tmp_path) == before  # no byte, mtime, -journal or -wal changed
    assert (report.source.format, report.source.framework) == ("nsys", "cuda")
    (r,) = report.ranks
    d = r.primary()
    start, end, busy = reference_busy(copy, d.device)
    assert r.window.kind == "gpu_activity"
    assert round(d.window_s * 1e9) == end - start
    assert round(d.busy_s * 1e9) == busy
    assert round(d.idle_s * 1e9) == end - start - busy
    assert round(sum(d.idle_by_cause_s.values()) * 1e9) == end - start - busy
    assert (d.name, d.compute_capability) == ("NVIDIA A100-SXM4-80GB", "8.0")
    db = sqlite3.connect(f"file:{copy}?mode=ro&immutable=1", uri=True)
    kernels = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    pageable = db.execute("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                          "WHERE copyKind = 1 AND srcKind = 0").fetchone()
    syncs = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                       "WHERE s.value LIKE 'cudaDeviceSynchronize%'").fetchone()[0]
    db.close()
    assert r.kernels.count == kernels
    assert (r.kernels.pageable_htod_copies, r.kernels.pageable_htod_bytes) == tuple(pageable)
    assert d.idle_by_cause_s["host_sync"] > 0
    assert syncs == kernels
    assert fingerprint(tmp_path) == before


def test_terminal_and_markdown_name_the_framework() -> None:
    for fmt in ("terminal", "md"):
        proc = gpuidle("analyze", str(REAL), "--no-ledger", "--format", fmt, "--color", "never")
        assert proc.returncode == 0, proc.stderr
        assert "nsys · CUDA application" in proc.stdout.splitlines()[0]


def test_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=90)
    odd = e.write(tmp_path / "profile.db")
    assert analyze([odd]).source.format == "nsys"


def test_annotated_export_and_html(tmp_path: Path) -> None:
    e = Export()
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=290)
    e.launch(at=600, call_dur=10, start=700, dur=300)
    src = e.write(tmp_path / "in.sqlite")
    before = fingerprint(tmp_path)
    tl = idle_timeline(src)
    out = tmp_path / "out" / "annotated.json.gz"
    out.parent.mkdir()
    annotate_trace(src, out, tl)
    doc = json.loads(gzip.decompress(out.read_bytes()))
    kernels = [ev for ev in doc["traceEvents"] if ev.get("cat") == "kernel"]
    idle = [ev for ev in doc["traceEvents"] if ev.get("cat") == "gpuidle"]
    assert [(k["ts"], k["dur"]) for k in kernels] == [(10, 290), (700, 300)]
    assert sum(ev["dur"] for ev in idle) == pytest.approx(410)  # [0,10) and [300,700)
    assert {ev["name"] for ev in doc["traceEvents"] if ev.get("cat") == "cuda_runtime"} == {"cudaLaunchKernel"}
    html = tmp_path / "out" / "report.html"
    proc = gpuidle("analyze", str(src), "--no-ledger", "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    page = html.read_text()
    assert "<svg" in page
    assert "nsys · PyTorch" in page  # ProfilerStep ranges: a PyTorch program
    assert fingerprint(tmp_path) == before


def _fake_nsys(folder: Path, export: Path) -> dict[str, str]:
    """A PATH whose ``nsys export ... --output OUT REPORT`` copies a prepared export to OUT."""
    script = folder / "nsys"
    script.write_text("#!/bin/sh\nout=''\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output ] && out=$2; shift; done\n"
                      f"cp '{export}' \"$out\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_nsys_rep_is_exported_with_nsys(tmp_path: Path) -> None:
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=90)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = _fake_nsys(bin_dir, e.write(tmp_path / "exported.sqlite"))
    rep = tmp_path / "run" / "report.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"not read by gpuidle itself")
    before = fingerprint(rep.parent)
    proc = gpuidle("analyze", str(rep), "--no-ledger", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["source"]["format"] == "nsys"
    assert doc["ranks"][0]["devices"][0]["busy_s"] == pytest.approx(90e-6)
    assert fingerprint(rep.parent) == before


def test_nsys_rep_without_nsys(tmp_path: Path) -> None:
    rep = tmp_path / "report.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    before = fingerprint(tmp_path)
    assert_one_line_error(gpuidle("analyze", str(rep), env=env), "nsys is not on PATH",
                          f"nsys export --type sqlite --output report.sqlite {rep}")
    assert fingerprint(tmp_path) == before


def test_sqlite_that_is_no_nsight_export(tmp_path: Path) -> None:
    other = tmp_path / "notes.sqlite"
    db = sqlite3.connect(other)
    with db:
        db.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
        db.execute("INSERT INTO notes VALUES (1, 'hello')")
    db.close()
    before = fingerprint(tmp_path)
    assert_one_line_error(gpuidle("analyze", str(other), "--no-ledger"), "not an Nsight Systems export")
    assert fingerprint(tmp_path) == before


@pytest.mark.parametrize("skip", [(), ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                                       "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME")])
def test_export_without_cuda_activity(skip: tuple[str, ...], tmp_path: Path) -> None:
    e = Export()
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.osrt("read", 0, 100)
    src = e.write(tmp_path / "cpu.sqlite", skip=skip)
    before = fingerprint(tmp_path)
    assert_one_line_error(gpuidle("analyze", str(src), "--no-ledger"), "no GPU activity", "--trace=cuda")
    assert fingerprint(tmp_path) == before


def test_an_export_that_lost_its_device_records_is_read_for_its_host_side(tmp_path: Path) -> None:
    """The real export with its device tables dropped: its kernel launches (counted here in SQL) stand for the
    records lost, the host side is reported, exit code 1 and nothing recorded, as for a Kineto trace."""
    src = tmp_path / "lost.sqlite"
    shutil.copy(REAL, src)
    db = sqlite3.connect(src)
    for table in DEVICE_TABLES:
        db.execute(f"DROP TABLE IF EXISTS {table}")
    launches = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON r.nameId = s.id "
                          "WHERE (s.value LIKE 'cudaLaunchKernel%' OR s.value LIKE 'cuLaunchKernel%') "
                          "AND r.correlationId >= 0").fetchone()[0]
    calls = db.execute("SELECT r.start, r.\"end\", s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                       "JOIN StringIds s ON r.nameId = s.id").fetchall()
    db.commit()
    db.close()
    assert launches == 1312
    before = fingerprint(tmp_path)
    (side,) = analyze([src]).host_side
    assert side.lost_launches == launches
    assert side.threads == 1
    for activity, prefixes in (("launch", ("cudaLaunchKernel",)), ("copy", ("cudaMemcpy",)),
                               ("sync", ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaFree"))):
        ranges = sorted((a, b) for a, b, name in calls if name.startswith(prefixes))
        covered, reach = 0, ranges[0][0]
        for a, b in ranges:  # the union of the calls' ranges (the one thread's window holds them all)
            covered += max(0, b - max(a, reach))
            reach = max(reach, b)
        assert side.activity_s[activity] == pytest.approx(covered / 1e9, abs=1e-9), activity
    proc = gpuidle("analyze", str(src), "--no-ledger")
    assert proc.returncode == 1, proc.stderr
    assert f"host side only: {launches} kernel launches with no kernel record" in proc.stdout
    assert "No fixes" in proc.stdout
    assert "not the ones this reader knows" not in proc.stdout  # its tables are known: the device's are gone
    assert fingerprint(tmp_path) == before


def test_device_records_without_their_times_are_refused_not_taken_for_lost(tmp_path: Path) -> None:
    src = tmp_path / "renamed.sqlite"
    shutil.copy(REAL, src)
    db = sqlite3.connect(src)
    db.execute('ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN "start" TO "begin"')
    db.commit()
    db.close()
    assert_one_line_error(gpuidle("analyze", str(src), "--no-ledger"), "CUPTI_ACTIVITY_KIND_KERNEL",
                          "without a start or end column")


def test_a_view_is_no_table_however_slow(tmp_path: Path) -> None:
    """A view is a query the file asks for: one that never ends, put where the environment table was, reads as
    that table missing (Nsight writes no views), and the export reads as the real one does."""
    src = tmp_path / "view.sqlite"
    shutil.copy(REAL, src)
    db = sqlite3.connect(src)
    db.execute("ALTER TABLE TARGET_INFO_SYSTEM_ENV RENAME TO env")
    db.execute("CREATE VIEW TARGET_INFO_SYSTEM_ENV AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 "
               "FROM r) SELECT env.* FROM env, r")  # every row of the table, without end
    db.commit()
    db.close()
    real = json.loads(gpuidle("analyze", str(REAL), "--json", "--no-ledger").stdout)
    proc = gpuidle("analyze", str(src), "--json", "--no-ledger")
    assert proc.returncode in (0, 1), proc.stderr
    viewed = json.loads(proc.stdout)
    assert viewed["ranks"][0]["devices"] == real["ranks"][0]["devices"]


@pytest.mark.parametrize("keep", [50, 4096, 0.5])
def test_truncated_export(keep: float, tmp_path: Path) -> None:
    data = REAL.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: int(len(data) * keep) if keep < 1 else int(keep)])
    before = fingerprint(tmp_path)
    assert_one_line_error(gpuidle("analyze", str(cut), "--no-ledger"), "truncated SQLite file")
    assert fingerprint(tmp_path) == before


def test_job_in_one_export_timeline_ledger_and_compare(tmp_path: Path) -> None:
    """Two ranks in one file: the HTML timeline re-reads the right rank; the ledger and compare take it."""
    from gpuidle.api import compare_runs, record_analysis, timeline_for

    e = Export()
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for pid, device, first in ((100, 0, 390), (200, 1, 190)):
        e.nvtx("ProfilerStep#1", 0, 1000, pid=pid)
        e.launch(at=0, call_dur=10, start=10, dur=first, pid=pid, device=device)
        e.launch(at=20, call_dur=10, start=400, dur=300, name=nccl, pid=pid, device=device, stream=20)
    src = e.write(tmp_path / "job.sqlite")
    report = analyze([src])
    worst = min(report.ranks, key=lambda r: r.primary().utilization)
    assert worst.rank == 1
    tl = timeline_for(report)
    assert tl.rank == 1
    assert [d.device for d in tl.devices] == [1]
    busy = sum(int(e) - int(s) for s, e in zip(*_complement(tl), strict=True))
    assert busy == round(worst.primary().busy_s * 1e9)
    ledger = tmp_path / "ledger.sqlite"
    run = record_analysis(report, label="nsys run", ledger_path=ledger)
    cmp, before, after = compare_runs(str(run), "nsys run", ledger_path=ledger)
    assert before.source.framework == after.source.framework == "pytorch"  # ProfilerStep ranges
    assert cmp is not None


def _complement(tl: IdleTimeline) -> tuple[list[int], list[int]]:
    """Busy intervals of the timeline's one device: the window less its idle segments."""
    (d,) = tl.devices
    lo, hi = d.window
    starts, ends, edge = [], [], lo
    for s, e in zip(d.seg_start.tolist(), d.seg_end.tolist(), strict=True):
        if s > edge:
            starts.append(edge)
            ends.append(s)
        edge = e
    if edge < hi:
        starts.append(edge)
        ends.append(hi)
    return starts, ends


@pytest.mark.parametrize("at", [0.3, 0.5])
def test_damaged_pages(at: float, tmp_path: Path) -> None:
    """Whole length, but 20 pages overwritten: SQLite finds it malformed on opening (the schema's pages)
    or while the tables are read (a data page); one line either way."""
    data = bytearray(REAL.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    start = int(len(data) * at) // page * page
    data[start:start + 20 * page] = b"\xff" * (20 * page)
    bad = tmp_path / "damaged.sqlite"
    bad.write_bytes(bytes(data))
    before = fingerprint(tmp_path)
    assert_one_line_error(gpuidle("analyze", str(bad), "--no-ledger"), str(bad))
    assert fingerprint(tmp_path) == before
