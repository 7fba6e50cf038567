"""The step tracker on a real pipeline × data-parallel mesh: each rank's place from its process groups, and the
stage that computes longest named as the pipeline's pace, never as a straggler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuidle.api import analyze
from gpuidle.live.tracker.groups import rank_groups
from gpuidle.model import TRACKER_SUMMARY, AnalysisReport

pytest.importorskip("torch.distributed")

SLOW_STAGE_MS = 60  # stage 0 computes 20 ms a step: three times as long, far above a busy machine's noise
HANG_GUARD_S = 600
"""Not a performance bound: only so that a rendezvous that never completes fails the test."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipeline")
    src = str(Path(__file__).parent.parent / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                           str(Path(__file__).parent / "mesh_tracker_job.py"), str(out), str(SLOW_STAGE_MS)],
                          env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _check(report: AnalysisReport, out: Path) -> None:
    assert report.job is not None
    for r in report.ranks:
        truth = json.loads((out / f"truth-{r.rank}.json").read_text())
        dims = {m.dim: m for m in r.communication.mesh}
        assert {d: dims[d].coordinate for d in ("pp", "dp")} == truth
        assert (dims["pp"].size, dims["dp"].size) == (2, 2)
        assert dims["pp"].source == "group 'mesh_pp'"
    pace = [n for n in report.job.notes if n.startswith("pipeline stage")]
    assert len(pace) == 1
    assert pace[0].startswith("pipeline stage 1 (ranks 2, 3) computes the longest")
    assert not {s.rank for s in report.job.stragglers} & {2, 3}


def test_the_summary_and_the_logs_give_each_rank_its_place(job: Path) -> None:
    _check(AnalysisReport.from_json((job / TRACKER_SUMMARY).read_bytes()), job)  # rank 0's view, the groups exchanged
    _check(analyze([job]), job)                                       # the logs read back


def test_groups_torch_does_not_give_are_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import distributed_c10d

    monkeypatch.delattr(distributed_c10d, "_get_all_pg_configs")
    groups, note = rank_groups(0, 4)
    assert groups == []
    assert note is not None
    assert note.startswith("process groups not read (AttributeError")
    assert note.endswith("each rank's place in the job's mesh (tensor, pipeline, data parallel) is not told")
