"""The log's step lines made a block at a time (``RowLayout.lines``) against a row read value by value.

Rows of every layout a tracker makes (no phase of its own, one, the PyTorch four; device- and host-timed), with
fractional, negative and large values: each field must be the row's value truncated as ``int()`` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuidle.live.tracker.exchange import TAIL, JobInfo, RowLayout
from gpuidle.model import TrackerStep


def reference_line(layout: RowLayout, row: np.ndarray, wait: int) -> TrackerStep:
    value = {c: int(row[i]) for i, c in enumerate(layout.cols)}
    return TrackerStep(
        step=value["step"], start_ns=value["start"], dur_ns=value["dur"], data_ns=value["data"],
        phases={p: value[f"host:{p}"] for p in layout.names},
        device_phases={p: value[f"device:{p}"] for p in layout.names} if layout.device_timed else {},
        comm_ns=value["comm"], comm_exposed_ns=value["exposed"], straggler_ns=wait, buckets=value["buckets"],
        bucket_bytes=value["bytes"], samples=value["samples"], batches=value["batches"],
        profiled=bool(value["profiled"]), sync_ns=value["sync"], syncs=value["syncs"],
    )


@pytest.mark.parametrize("timing", ["device", "host"])
@pytest.mark.parametrize("phases", [[], ["train_step"], ["h2d", "forward", "backward", "optimizer"]])
def test_lines_equal_the_rows_read_value_by_value(phases: list[str], timing: str) -> None:
    layout = RowLayout(phases, JobInfo(world_size=1, out_dir=Path("out"), timing=timing, device=0, device_name=None,
                                       compute_phases=phases[:1], copy_phase=""))
    assert len(layout.cols) == 4 + 2 * (len(phases) + 1) + len(TAIL)
    rng = np.random.default_rng(len(phases))
    for _ in range(20):
        scale = rng.choice([1.0, 1e3, 1e12])
        rows = rng.random((17, layout.width)) * scale * rng.choice([1, -1], size=(17, layout.width))
        rows[:, layout.col["profiled"]] = rng.choice([0.0, 0.4, 1.0], size=17)
        waits = rng.integers(0, 10 ** 10, 17)
        expected = [reference_line(layout, r, int(w)) for r, w in zip(rows, waits, strict=True)]
        assert layout.lines(rows, waits) == expected
        assert layout.lines(rows) == [reference_line(layout, r, 0) for r in rows]
    assert layout.lines(np.zeros((0, layout.width))) == []
