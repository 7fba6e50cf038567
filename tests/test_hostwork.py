"""A heavy operator's self time, all rows at once, against a row-by-row nanosecond reference.

Random ranges on a few threads (nested, overlapping, touching, empty, reversed, one row listed twice), and every
operator of three real traces: the nanoseconds :func:`self_time` returns must be, exactly, each row's range less
the ranges of ``nested`` on its thread that start inside it and end by its end (the row itself excepted).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpuidle.analysis import hostwork
from gpuidle.analysis import intervals as iv


def reference_ns(start: list[int], end: list[int], thread: list[int], rows: list[int], nested: list[int]) -> set[int]:
    out: set[int] = set()
    for r in rows:
        inside = [n for n in nested if thread[n] == thread[r] and n != r
                  and start[r] <= start[n] < end[r] and end[n] <= end[r]]
        covered = {t for n in inside for t in range(start[n], end[n])}
        out |= {t for t in range(start[r], end[r]) if t not in covered}
    return out


def ns(iv_: iv.Intervals) -> set[int]:
    return {t for s, e in zip(iv_[0].tolist(), iv_[1].tolist(), strict=True) for t in range(s, e)}


@pytest.mark.parametrize("lane_limit", [1 << 62, 50], ids=["one-batch", "many-batches"])
@pytest.mark.parametrize("seed", range(150))
def test_self_time_matches_a_row_by_row_reference(seed: int, lane_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostwork, "LANE_LIMIT", lane_limit)
    rng = random.Random(seed)
    n = rng.randint(0, 40)
    start = [rng.randrange(80) for _ in range(n)]
    end = [s + rng.choice([0, 1, 2, 3, 5, 8, 13, 30, 60, -3]) for s in start]
    thread = [rng.randrange(3) for _ in range(n)]
    rows = sorted(rng.sample(range(n), rng.randint(0, n))) if n else []
    if rows and rng.random() < 0.3:
        rows.append(rows[0])
    nested = sorted(rng.sample(range(n), rng.randint(0, n))) if n else []
    a = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    got = hostwork.self_time(a(start), a(end), np.array(thread, dtype=np.int32), a(rows), a(nested))
    assert ns(got) == reference_ns(start, end, thread, rows, nested)


def rowwise(start: np.ndarray, end: np.ndarray, thread: np.ndarray, rows: np.ndarray, nested: np.ndarray,
            ) -> iv.Intervals:
    """Row by row, the nested ranges of each row found and its gaps taken one row at a time."""
    out_s, out_e = [iv.EMPTY[0]], [iv.EMPTY[1]]
    for r in rows.tolist():
        lo, hi = int(start[r]), int(end[r])
        mask = (thread[nested] == thread[r]) & (nested != r) & (start[nested] >= lo) & (start[nested] < hi) \
            & (end[nested] <= hi)
        gaps = iv.complement(iv.union(start[nested[mask]], end[nested[mask]]), lo, hi)
        out_s.append(gaps[0])
        out_e.append(gaps[1])
    return np.concatenate(out_s), np.concatenate(out_e)


@pytest.mark.parametrize("name", ["h200_dataloader__before.pt.trace.json.gz", "trace_filter__sampled_rank-0.json.gz",
                                  "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
def test_self_time_of_every_operator_of_real_traces(name: str) -> None:
    from conftest import DATA
    from gpuidle.model import HostKind
    from gpuidle.sources import kineto

    host = kineto.read(str(DATA / name)).host
    rows = np.flatnonzero(host.kind == HostKind.OP)
    nested = np.flatnonzero((host.kind == HostKind.OP) | (host.kind == HostKind.RUNTIME))
    assert rows.size > 50
    got = iv.union(*hostwork.self_time(host.start, host.end, host.thread, rows, nested))
    want = iv.union(*rowwise(host.start, host.end, host.thread, rows, nested))
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1])
    assert 0 < iv.total(got) < iv.total(iv.union(host.start[rows], host.end[rows]))
