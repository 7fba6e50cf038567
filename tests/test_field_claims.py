"""A malformed field in any reader's input is the project's own one-line error, naming the field and its value;
an exception that escapes a reader is a bug, and says so."""

from __future__ import annotations

import io
import math
import sqlite3
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuidle.cli import main
from gpuidle.jobs import rank
from nsysexport import Export
from xspace_steps import profile, xprof_json

DAY_PS = 86400 * 10**12
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


def export(path: Path) -> Path:
    e = Export()
    for n in range(5):
        e.nvtx(f"ProfilerStep#{n}", n * 1000.0, 1000)
        e.launch(at=n * 1000.0 + 5, call_dur=5, start=n * 1000.0 + 10, dur=600)
    return e.write(path)


def set_cell(path: Path, table: str, column: str, value: Any) -> Path:
    db = sqlite3.connect(path)
    with db:
        db.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = 2", (value,))
    db.close()
    return path


def run(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", "--no-ledger", str(path)])
    return code, out.getvalue(), err.getvalue()


def one_line_error(path: Path, *needles: str) -> str:
    code, _, err = run(path)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuidle: error: ")
    assert "internal error" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("column", "value", "shown"), [
    ("streamId", "abc", "CUPTI_ACTIVITY_KIND_KERNEL.streamId holds 'abc', not an integer"),
    ("start", b"\x01\x02", "CUPTI_ACTIVITY_KIND_KERNEL.start holds b'\\x01\\x02', not an integer"),
    ("end", 1e300, "CUPTI_ACTIVITY_KIND_KERNEL.end holds 1e+300, not an integer"),
])
def test_nsight_text_or_a_blob_in_an_integer_column(tmp_path: Path, column: str, value: Any, shown: str) -> None:
    one_line_error(set_cell(export(tmp_path / "r.sqlite"), KERNEL, column, value), shown)


@pytest.mark.parametrize(("column", "value"), [("deviceId", -5), ("streamId", 1 << 40)])
def test_nsight_ids_outside_their_range(tmp_path: Path, column: str, value: int) -> None:
    one_line_error(set_cell(export(tmp_path / "r.sqlite"), KERNEL, column, value),
                   f"device activity with {column} {value} (1 row(s)): not an id")


def test_nsight_timestamps_at_int64_max_are_refused_as_the_kineto_reader_does(tmp_path: Path) -> None:
    path = export(tmp_path / "r.sqlite")
    set_cell(path, KERNEL, "start", (1 << 63) - 1000)
    one_line_error(set_cell(path, KERNEL, "end", (1 << 63) - 1), "the events span 106752 days")


@pytest.mark.parametrize(("value", "shown"), [({"double_value": math.inf}, "step_num stat is inf"),
                                              ({"uint64_value": (1 << 64) - 1}, "18446744073709551615")])
def test_an_xspace_step_number_beyond_64_bits(tmp_path: Path, value: dict[str, Any], shown: str) -> None:
    one_line_error(profile(tmp_path / "h.xplane.pb", step_num=value), shown, "beyond a 64-bit integer")


@pytest.mark.parametrize("ids", [{"gpu_id": 1 << 40}, {"stream_id": 10**20}])
def test_an_xspace_gpu_or_stream_numbered_past_32_bits(tmp_path: Path, ids: dict[str, int]) -> None:
    one_line_error(profile(tmp_path / "h.xplane.pb", **ids), "numbers a GPU or a stream past 32 bits")


@pytest.mark.parametrize("ts", [1e300, -1e20])
def test_an_xprof_json_time_past_int64_nanoseconds(tmp_path: Path, ts: float) -> None:
    """Before: a RuntimeWarning on stderr and a report of wrapped times."""
    one_line_error(xprof_json(tmp_path / "h.trace.json.gz", ts), f"event 'train' has ts {ts} µs", "not a time")


def test_an_xspace_marker_days_late_is_refused_as_a_span(tmp_path: Path) -> None:
    one_line_error(profile(tmp_path / "h.xplane.pb", late_ps=52 * DAY_PS), "the events span 52 days")


def test_a_bug_in_a_reader_is_reported_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception no reader should raise is not dressed as bad input: it asks to be reported."""
    def broken(path: str, progress: object = None) -> list[object]:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(rank, "read_timelines", broken)
    (outcome,) = rank.analyze_file(str(export(tmp_path / "r.sqlite")))
    assert outcome.error == "an internal error: please report it (ZeroDivisionError: division by zero)"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(100, 4095), st.integers(0, 7)), min_size=1, max_size=4))
def test_bits_flipped_in_the_schema_page_give_a_report_or_one_line(tmp_path: Path,
                                                                    flips: list[tuple[int, int]]) -> None:
    """The first page of an export holds its schema, table names and column lists as text: whatever bits flip
    there, a report or one line, never a bug (a flipped name once escaped as a UnicodeDecodeError)."""
    path = export(tmp_path / "flip.sqlite")
    data = bytearray(path.read_bytes())
    for at, bit in flips:
        data[at] ^= 1 << bit
    path.write_bytes(bytes(data))
    code, _, err = run(path)
    assert code in (0, 2), err
    assert "internal error" not in err
    assert len(err.strip().splitlines()) <= 3


CELLS = st.one_of(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), st.text(max_size=6),
                  st.binary(max_size=6), st.floats(allow_nan=False, allow_infinity=True))  # SQLite stores NaN as NULL
COLUMNS = ["start", "end", "deviceId", "streamId", "correlationId", "shortName", "globalPid"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(st.tuples(st.sampled_from(COLUMNS), CELLS), min_size=1, max_size=3))
def test_any_kernel_cell_gives_a_report_or_one_line(tmp_path: Path, cells: list[tuple[str, Any]]) -> None:
    """Whatever a kernel row's cells hold: exit 0 with a report, or exit 2 with one line; never a bug."""
    path = export(tmp_path / "fuzz.sqlite")
    for column, value in cells:
        set_cell(path, KERNEL, column, value)
    code, out, err = run(path)
    assert code in (0, 2), err
    assert "internal error" not in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3
    assert code == 2 or out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(
    st.fixed_dictionaries({"double_value": st.floats(allow_nan=True, allow_infinity=True)}),
    st.fixed_dictionaries({"uint64_value": st.integers(0, (1 << 64) - 1)}),
    st.fixed_dictionaries({"int64_value": st.integers(-(1 << 63), (1 << 63) - 1)}),
    st.fixed_dictionaries({"str_value": st.text(max_size=8)})),
    late=st.integers(0, 1 << 62))
def test_any_xspace_step_marker_gives_a_report_or_one_line(tmp_path: Path, value: dict[str, Any],
                                                           late: int) -> None:
    code, _, err = run(profile(tmp_path / "h.xplane.pb", step_num=value, late_ps=late))
    assert code in (0, 2), err
    assert "internal error" not in err
    assert len(err.strip().splitlines()) <= 3
