"""`analyze --price-per-gpu-hour`: the cost section, recomputed by hand from the report's own figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import DATA


def test_cost_in_the_json_report() -> None:
    trace = str(DATA / "nccl_parser_config__nccl_data.json.gz")
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", trace, "--json",
                           "--price-per-gpu-hour", "2.5", "--hours", "72", "--no-ledger"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    u = doc["ranks"][0]["devices"][0]["utilization"]
    cost = doc["cost"]
    # one GPU with work in the window: the traced rank of a two-rank job, priced as traced, the rest named
    assert [d["busy_s"] > 0 for d in doc["ranks"][0]["devices"]] == [True]
    assert cost["gpus"] == 1
    assert any("1 of the job's 2 ranks" in n for n in cost["notes"])
    assert cost["wasted_gpu_hours"] == pytest.approx(72 * (1 - u))
    assert cost["wasted_money"] == pytest.approx(72 * (1 - u) * 2.5)
    assert cost["hours_at_target"] == pytest.approx(72 * u / 0.9)
    assert cost["money_saved"] == pytest.approx((72 - 72 * u / 0.9) * 2.5)
    assert all(line["formula"] and line["worked"] for line in cost["lines"])


def test_no_cost_without_a_price() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(DATA / "trace_compare__base__base.json.gz"),
                           "--json", "--no-ledger"], capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stdout)["cost"] is None
