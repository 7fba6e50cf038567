"""The tracker's numbers as Prometheus metrics: scraped over HTTP, parsed with prometheus_client's
own parser, and checked against the job summary the tracker writes and against hand computation."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from gpuidle.model import CAUSES, TRACKER_METRICS

torch = pytest.importorskip("torch")
parser = pytest.importorskip("prometheus_client.parser")

from gpuidle.live.tracker import StepTracker  # noqa: E402

MS = 1_000_000
PHASES = ["h2d", "forward", "backward", "optimizer", "other"]
HOST_COL = {p: 4 + i for i, p in enumerate(PHASES)}
EXPOSED_COL = 4 + 2 * len(PHASES) + 1


class Clock:
    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t


def _gather(rows: np.ndarray) -> np.ndarray:
    """Rank 1's rows are rank 0's with 4 ms more forward, 4 ms less backward and exposed communication."""
    if rows.shape[1] == 1:
        return np.stack([rows, rows])
    other = rows.copy()
    other[:, HOST_COL["forward"]] += 4 * MS
    other[:, HOST_COL["backward"]] -= 4 * MS
    other[:, EXPOSED_COL] -= 4 * MS
    return np.stack([rows, other])


def _scrape(port: int, families: dict[str, str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by name and labels; ``families`` gets each family's type."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        if families is not None:
            families[fam.name] = fam.type
        out.update({(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples})
    return out


def test_the_metrics_match_the_job_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")  # as a Kubernetes pod spec sets it, and the exporter reads it
    clk = Clock()
    waits = [1, 3, 2, 5, 1, 2, 4, 1, 3, 2] * 2
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, every=5, gather=_gather, rank=0, world_size=2,
                     log=lambda _: None, ledger=False, label="resnet", prometheus_port=0)
    assert tr.prometheus_port
    for wait in waits:
        clk.t += wait * MS
        tr.add_data_wait(wait * MS, samples=8)
        with tr.phase("forward"):
            clk.t += 2 * MS
        with tr.phase("backward"):
            clk.t += 10 * MS
            entry = tr._bucket_ready(torch.zeros(64))
            clk.t += 5 * MS
            tr._bucket_done(entry)
        tr.step()
    families: dict[str, str] = {}
    got = _scrape(tr.prometheus_port, families)  # every step was exchanged (every=5, host timing reads at once)
    assert families == {m.name.removesuffix("_total"): m.kind for m in TRACKER_METRICS}  # the catalogue, no more
    report = tr.close()
    assert report is not None
    assert report.job is not None

    def value(name: str, rank: int, **extra: str) -> float:
        labels = {"job": "resnet", "rank": str(rank), "Hostname": "node-7", **extra}
        return got[(name, tuple(sorted(labels.items())))]

    n = len(waits)
    steps_s = [(w + 17) / 1e3 for w in waits]
    for r, rank in enumerate(report.ranks):
        d = rank.primary()
        assert value("gpuidle_tracker_step_seconds", r) == pytest.approx(
            float(np.median([s.dur_s for s in rank.steps])))
        assert value("gpuidle_tracker_step_seconds", r) == pytest.approx(float(np.median(steps_s)))
        assert value("gpuidle_tracker_data_wait_ratio", r) == pytest.approx(
            d.idle_by_cause_s["data_loading"] / d.window_s)
        assert value("gpuidle_tracker_data_wait_ratio", r) == pytest.approx(sum(waits) / (sum(waits) + 17 * n))
        assert value("gpuidle_tracker_exposed_communication_seconds", r) == pytest.approx(
            rank.communication.exposed_s / n)
        for cause in CAUSES:
            assert value("gpuidle_tracker_idle_seconds_total", r, cause=cause.value) == pytest.approx(
                d.idle_by_cause_s[cause.value], abs=1e-12)
    assert value("gpuidle_tracker_exposed_communication_seconds", 0) == pytest.approx(0.005)
    assert value("gpuidle_tracker_exposed_communication_seconds", 1) == pytest.approx(0.001)
    assert value("gpuidle_tracker_idle_seconds_total", 0, cause="straggler_wait") == pytest.approx(n * 0.004)
    (straggler,) = report.job.stragglers
    assert straggler.rank == 1
    assert value("gpuidle_tracker_straggler_score", 1) == pytest.approx(straggler.score)
    own = [w + 13 for w in waits]  # rank 0's step less its 4 ms wait
    assert value("gpuidle_tracker_straggler_score", 1) == pytest.approx(
        float(np.median(steps_s)) * 1e3 / float(np.median(own)))
    assert value("gpuidle_tracker_straggler_score", 0) == pytest.approx(1.0)
    with pytest.raises(urllib.error.URLError):  # served until close()
        _scrape(tr.prometheus_port)


def test_no_metrics_unless_asked_and_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    from gpuidle.errors import GpuidleError

    tr = StepTracker(tmp_path / "a", device_clock=None, log=lambda _: None, ledger=False)
    assert tr.prometheus_port is None
    tr.close()
    first = StepTracker(tmp_path / "b", device_clock=None, log=lambda _: None, ledger=False, prometheus_port=0)
    assert first.prometheus_port is not None
    with pytest.raises(GpuidleError, match="cannot serve the tracker's metrics"):
        StepTracker(tmp_path / "c", device_clock=None, log=lambda _: None, ledger=False,
                    prometheus_port=first.prometheus_port)
    first.close()
