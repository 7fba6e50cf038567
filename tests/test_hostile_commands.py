"""Hostile input beyond the trace readers: every command's files, outputs and ids end in one error line (exit 2),
never a traceback, a hang, memory without bound or an overwritten device or FIFO.

Each case is one that a review found failing: a gzip bomb read whole as a counter log, ``cost --from`` on a FIFO
or ``/dev/zero``, a full standard output, ``--annotate`` over a FIFO, a run id past SQLite's integers, times
past 64 bits in an Nsight export and an XSpace profile, timestamps of ±1e308 in a Prometheus log, tens of
thousands of devices, an XSpace profile beside another host's, and an empty path.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.errors import CorruptInput, InputNotFound
from gpuidle.sources import formats, smi
from test_cli_errors import assert_one_line_error

NCCL = DATA / "nccl_parser_config__nccl_data.json.gz"
EXPORT = DATA / "cloverleaf_a100__perlmutter-cloverleaf-cuda.sqlite"
XSPACE = DATA / "jax08_conv_mi300x8__tw003.xplane.pb"


def gpuidle(*args: str, stdout: int | None = None, ledger: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUIDLE_LEDGER": str(ledger or "/nonexistent-gpuidle-test/ledger.sqlite")}
    return subprocess.run([sys.executable, "-m", "gpuidle", *args], stdout=stdout or subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60, env=env)


def zeros_gzip(path: Path, mib: int) -> Path:
    """``mib`` MiB of zero bytes in a gzip of a thousandth of that."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with path.open("wb") as f:
        block = bytes(1 << 20)
        for _ in range(mib):
            f.write(z.compress(block))
        f.write(z.flush())
    return path


def test_a_gzip_bomb_is_not_read_whole_as_a_counter_log(tmp_path: Path) -> None:
    bomb = zeros_gzip(tmp_path / "bomb.csv.gz", 96)
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(CorruptInput, match="more than 64 MiB once decompressed"):
        smi.read(bomb, max_bytes=64 << 20)
    # analyze tries a file it refused as a trace as a counter log: bounded the same way, the trace's error stands
    assert_one_line_error(gpuidle("analyze", "--no-ledger", str(zeros_gzip(tmp_path / "bomb.json.gz", 96))),
                          "not JSON")


def test_a_log_within_its_bound_reads_as_before(tmp_path: Path) -> None:
    log = (DATA / "smi" / "dmon_default.log").read_bytes()
    packed = tmp_path / "dmon.log.gz"
    packed.write_bytes(gzip.compress(log) + gzip.compress(b""))  # two members, as cat a.gz b.gz makes
    read = [(d.device, d.t.tolist()) for d in smi.read(packed).devices]
    assert read == [(d.device, d.t.tolist()) for d in smi.read(DATA / "smi" / "dmon_default.log").devices]
    with pytest.raises(CorruptInput, match="more than 0 MiB"):
        smi.read(DATA / "smi" / "dmon_default.log", max_bytes=len(log) - 1)


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_cost_from_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path, special: str) -> None:
    path = special
    if special == "fifo":
        path = str(tmp_path / "report.json")
        os.mkfifo(path)
    proc = gpuidle("cost", "--from", path, "--hours", "10", "--price-per-gpu-hour", "2")
    assert_one_line_error(proc, "not a regular file")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("command", [["analyze", "--no-ledger", str(NCCL)], ["history"]])
def test_a_full_standard_output_is_one_error_line(command: list[str], tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = gpuidle(*command, stdout=full.fileno(), ledger=tmp_path / "ledger.sqlite")
    assert_one_line_error(proc, "No space left on device")


def test_annotate_writes_files_only_and_through_links(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    assert_one_line_error(gpuidle("analyze", "--no-ledger", "--annotate", str(fifo), str(NCCL)), "not a regular file")
    assert fifo.is_fifo()
    assert_one_line_error(gpuidle("analyze", "--no-ledger", "--annotate", str(tmp_path), str(NCCL)),
                          "not a regular file")
    target, link = tmp_path / "annotated.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    assert gpuidle("analyze", "--no-ledger", "--annotate", str(link), str(NCCL)).returncode in (0, 1)
    assert link.is_symlink()
    assert json.loads(target.read_text())["traceEvents"]


@pytest.mark.parametrize("ref", ["99999999999999999999999", "²"])
def test_a_run_id_no_ledger_can_hold_is_no_run(ref: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    assert gpuidle("analyze", str(NCCL), "--ledger", str(ledger)).returncode in (0, 1)
    assert_one_line_error(gpuidle("compare", ref, "1", "--ledger", str(ledger)), f"no run {ref!r}")


def test_an_nsight_row_that_starts_past_its_end_at_int64_max_is_a_span_error(tmp_path: Path) -> None:
    src = tmp_path / "late.sqlite"
    shutil.copy(EXPORT, src)
    db = sqlite3.connect(src)
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 9223372036854775807 "
               "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    db.commit()
    db.close()
    assert_one_line_error(gpuidle("analyze", "--no-ledger", str(src)), "the events span")


def test_an_xspace_duration_past_int64_picoseconds_is_a_span_error_not_a_report(tmp_path: Path) -> None:
    from gpuidle.sources import xplanes

    space = xplanes._xplane_module().XSpace()
    space.ParseFromString(XSPACE.read_bytes())
    gpu = next(p for p in space.planes if p.name.startswith("/device:GPU"))
    line = next(ln for ln in gpu.lines if ln.events)
    line.events[0].duration_ps = (1 << 63) - 1  # offset + duration in ps wraps int64; their ns do not
    out = tmp_path / "long.xplane.pb"
    out.write_bytes(space.SerializeToString())
    assert_one_line_error(gpuidle("analyze", "--no-ledger", str(out)), "the events span")


def test_prometheus_points_past_any_date_are_dropped(tmp_path: Path) -> None:
    real = json.loads((DATA / "smi" / "prometheus_query_range.json").read_text())
    for series in real["data"]["result"]:
        series["values"] = [[1e308, "50"], [-1e308, "50"], *series["values"]]
    path = tmp_path / "prom.json"
    path.write_text(json.dumps(real))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow in numpy would warn
        got = smi.read(path)
    want = smi.read(DATA / "smi" / "prometheus_query_range.json")
    assert [d.t.tolist() for d in got.devices] == [d.t.tolist() for d in want.devices]


def test_tens_of_thousands_of_devices_are_refused_not_analysed(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0 + i, "dur": 0.5,
               "args": {"device": i, "stream": 7}} for i in range(formats.MAX_DEVICES + 1)]
    trace = tmp_path / "devices.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert_one_line_error(gpuidle("analyze", "--no-ledger", str(trace)),
                          f"{formats.MAX_DEVICES + 1} devices in one rank")
    gpus = len(smi.read(DATA / "smi" / "dmon_default.log").devices)
    monkeypatch.setattr(smi, "MAX_LOG_DEVICES", gpus - 1)
    with pytest.raises(CorruptInput, match=f"{gpus} GPUs in one log"):
        api.summarize_log(DATA / "smi" / "dmon_default.log")


def test_an_xspace_profile_beside_another_hosts_draws_and_annotates(tmp_path: Path) -> None:
    """Alone it is rank 0 of the files given, though it is the second of its folder's."""
    for name in ("a", "b"):
        shutil.copy(XSPACE, tmp_path / f"{name}.xplane.pb")
    page, annotated = tmp_path / "b.html", tmp_path / "b.json.gz"
    proc = gpuidle("analyze", "--no-ledger", "--html", str(page), "--annotate", str(annotated),
                   str(tmp_path / "b.xplane.pb"))
    assert proc.returncode in (0, 1), proc.stderr
    assert page.stat().st_size > 0
    assert json.loads(gzip.decompress(annotated.read_bytes()))["traceEvents"]


def test_an_empty_path_is_no_path() -> None:
    """Not the current folder: an unset shell variable (``gpuidle analyze "$TRACE"``) would analyse it."""
    assert_one_line_error(gpuidle("analyze", "--no-ledger", ""), "an empty path")
    with pytest.raises(InputNotFound, match="an empty path"):
        api.analyze([str(NCCL), " "])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc to read a process's peak memory")
def test_a_file_read_whole_reads_no_more_than_its_bound(tmp_path: Path) -> None:
    """An 8 GiB log (sparse: no disk) refused after its first MiB and a byte, in a process that stays small."""
    big = tmp_path / "dmon.log"
    with big.open("wb") as f:
        f.truncate(8 << 30)
    # the peak of this process's own memory (VmHWM): ru_maxrss keeps the forking parent's across exec
    code = ("import sys\nfrom gpuidle.errors import CorruptInput\nfrom gpuidle.sources import smi\n"
            "try:\n    smi.read(sys.argv[1], max_bytes=1 << 20)\nexcept CorruptInput as err:\n    print(err)\n"
            "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM')).split()[1])")
    out = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    assert "more than 1 MiB" in out[0]
    assert int(out[1]) < 400_000  # KiB: the interpreter and numpy, not the file
