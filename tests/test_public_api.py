"""The library face: ``import gpuidle`` gives the API, its docstring example runs, reports round-trip JSON."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuidle
from conftest import DATA

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", gpuidle.__all__)
def test_every_public_name_imports(name: str) -> None:
    assert getattr(gpuidle, name) is not None
    assert name in dir(gpuidle)


def test_no_private_leaks() -> None:
    assert "annotations" not in gpuidle.__all__
    with pytest.raises(AttributeError):
        _ = gpuidle.no_such_name  # type: ignore[attr-defined]


def test_the_docstring_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    result = doctest.testmod(gpuidle, raise_on_error=False, verbose=False)
    assert result.attempted >= 4
    assert result.failed == 0


def test_reports_round_trip_through_json(tmp_path: Path) -> None:
    report = gpuidle.analyze([str(DATA / "trace_compare__base__base.json.gz")])
    assert gpuidle.AnalysisReport.from_json(report.to_json(indent=2)) == report
    log = tmp_path / "smi.csv"
    log.write_text("timestamp, index, utilization.gpu [%]\n"
                   "2024/01/01 00:00:00.000, 0, 50 %\n2024/01/01 00:00:01.000, 0, 70 %\n"
                   "2024/01/01 00:00:02.000, 0, 90 %\n")
    util = gpuidle.summarize_log(log)
    assert gpuidle.UtilizationReport.from_json(util.to_json()) == util


def test_from_json_refuses_another_shape() -> None:
    import msgspec

    with pytest.raises(msgspec.ValidationError):
        gpuidle.AnalysisReport.from_json(b'{"schema": "x"}')


def test_the_tracker_without_torch_says_what_to_install() -> None:
    code = "import sys; sys.modules['torch'] = None\nimport gpuidle.torch\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: gpuidle.torch needs PyTorch")
    assert "pip install 'gpuidle[torch]'" in last
