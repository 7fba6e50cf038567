"""What every step tracker leaves beside its logs, checked alike for each framework's."""

from __future__ import annotations

from pathlib import Path

from gpuidle.ledger import Ledger
from gpuidle.model import AnalysisReport


def assert_served_and_recorded(scraped: str, ledger_path: Path, label: str, framework: str) -> None:
    """Rank 0's ``gpuidle_tracker_step_seconds`` was served while the loop ran (``scraped``: one read of
    ``/metrics``), and the job summary is the ledger's one run, labelled ``label``, in ``framework``'s words."""
    step = [line for line in scraped.splitlines() if line.startswith("gpuidle_tracker_step_seconds{")]
    assert step
    assert 'rank="0"' in step[0]
    assert float(step[0].rsplit(" ", 1)[1]) > 0
    with Ledger(ledger_path) as ledger:
        (run,) = ledger.runs()
    assert (run.kind, run.label) == ("tracker", label)
    assert AnalysisReport.from_json(run.report).source.framework == framework
