"""Names from the inputs never reach the terminal raw: control characters are shown as escapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuidle.cli import main
from gpuidle.report.text import printable
from minitrace import Trace

EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
"""An OSC that sets the terminal's title, a CSI that clears the screen, a C1 CSI, a right-to-left override."""
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def clean(text: str) -> bool:
    return not any(c in text for c in RAW)


def test_printable() -> None:
    assert printable(EVIL) == SHOWN
    assert printable("rank 0\tGPU\r\nx") == "rank 0\\x09GPU\\x0d\\x0ax"
    assert printable("line 1\nline 2", keep_newlines=True) == "line 1\nline 2"
    assert printable("\udcff.json") == "\\udcff.json"  # a non-UTF-8 byte of a file name
    assert printable("NVIDIA H100 80GB HBM3 · µs → ok") == "NVIDIA H100 80GB HBM3 · µs → ok"


def _trace(tmp_path: Path) -> Path:
    t = Trace()
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base, 600)
        t.launch(at=base + 600, call_dur=10, start=base + 620, dur=380, name="gemm" + EVIL)
    doc = t.to_dict()
    doc["deviceProperties"][0]["name"] = "GPU" + EVIL
    doc["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1,
                               "args": {"name": "main" + EVIL}})
    path = tmp_path / f"rank0{EVIL}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("fmt", ["terminal", "md"])
def test_analyze_shows_a_hostile_device_name_escaped(tmp_path: Path, fmt: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path)
    assert main(["analyze", str(trace), "--format", fmt, "--color", "never", "--label", "x" + EVIL]) == 0
    out = capsys.readouterr()
    assert clean(out.out)
    assert clean(out.err)
    assert f"GPU{SHOWN}" in out.out


def test_the_html_page_shows_it_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "r.html"
    assert main(["analyze", str(_trace(tmp_path)), "--out", str(page), "--no-ledger"]) == 0
    html = page.read_text()
    assert clean(html)
    assert "GPU\\x1b]0;pwned\\x07" in html


def test_error_and_warning_lines_show_a_file_name_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / f"rank1{EVIL}.json"
    bad.write_text("{ not json")
    assert main(["analyze", str(bad), "--no-ledger"]) == 2
    err = capsys.readouterr().err
    assert clean(err)
    assert f"rank1{SHOWN}.json" in err
    not_a_ledger = tmp_path / f"l{EVIL}.sqlite"
    not_a_ledger.write_text("notes\n" * 1000)
    assert main(["analyze", str(_trace(tmp_path)), "--ledger", str(not_a_ledger), "--format", "md"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpuidle: warning: ")
    assert clean(line)
    assert SHOWN in line


def test_summarize_history_and_compare_show_names_and_labels_escaped(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "util.csv"
    rows = [f"2024/05/02 12:00:0{i}.000, 0, GPU{EVIL}, {u} %" for i, u in enumerate([90, 20, 95, 97])]
    log.write_text("timestamp, index, name, utilization.gpu [%]\n" + "\n".join(rows) + "\n")
    ledger = tmp_path / "l.sqlite"
    assert main(["summarize", str(log), "--color", "never", "--label", "util" + EVIL, "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert clean(out)
    assert f"GPU{SHOWN}" in out
    trace = _trace(tmp_path)
    for label in ("before" + EVIL, "after" + EVIL):
        assert main(["analyze", str(trace), "--json", "--label", label, "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    assert main(["history", "--ledger", str(ledger), "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert clean(out)
    assert f"before{SHOWN}" in out
    for fmt in ("terminal", "md"):
        assert main(["compare", "before" + EVIL, "after" + EVIL, "--ledger", str(ledger), "--format", fmt,
                     "--color", "never"]) == 0
        out = capsys.readouterr().out
        assert clean(out)
        assert f"after{SHOWN}" in out
