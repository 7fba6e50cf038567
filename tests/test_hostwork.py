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


def innermost_sweep(start: np.ndarray, end: np.ndarray, rows: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The innermost covering row by one sweep with a stack of open ranges (the former, row-by-row code)."""
    out = np.full(points.size, -1, dtype=np.int64)
    order = rows[np.lexsort((-end[rows], start[rows]))]
    s, e = start[order].tolist(), end[order].tolist()
    stack: list[int] = []
    k = 0
    for j in np.argsort(points, kind="stable").tolist():
        p = int(points[j])
        while k < len(s) and s[k] <= p:
            while stack and e[stack[-1]] <= s[k]:
                stack.pop()
            stack.append(k)
            k += 1
        while stack and e[stack[-1]] <= p:
            stack.pop()
        if stack:
            out[j] = order[stack[-1]]
    return out


@pytest.mark.parametrize("block", [2, 3, 32], ids=["block-2", "block-3", "block-32"])
@pytest.mark.parametrize("seed", range(120))
def test_innermost_matches_a_sweep_with_a_stack(seed: int, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostwork, "BLOCK", block)
    monkeypatch.setattr(hostwork, "QUERY_BATCH", 7)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    if seed % 3 == 0:  # nested: a call stack that opens and closes frames
        start, end, open_, t = [], [], [], 0
        for _ in range(n):
            t += int(rng.integers(0, 4))
            if open_ and rng.random() < 0.45:
                end[open_.pop()] = t
            else:
                open_.append(len(start))
                start.append(t)
                end.append(t)
        for i in open_:
            end[i] = t + int(rng.integers(0, 5))
        start_a, end_a = np.array(start, dtype=np.int64), np.array(end, dtype=np.int64)
    else:  # anything: overlapping without nesting, equal starts, empty and reversed ranges
        start_a = rng.integers(0, 200, n)
        end_a = start_a + rng.choice([0, 1, 2, 5, 30, 120, -3], n)
    rows = rng.choice(start_a.size, int(rng.integers(0, start_a.size + 1)), replace=True) if start_a.size else \
        np.zeros(0, dtype=np.int64)
    points = rng.integers(-5, int(end_a.max(initial=0)) + 5, int(rng.integers(0, 200)))
    got = hostwork.innermost(start_a, end_a, rows.astype(np.int64), points)
    assert np.array_equal(got, innermost_sweep(start_a, end_a, rows.astype(np.int64), points))


def test_innermost_of_a_deep_stack_finds_the_frame_far_back() -> None:
    # 200,000 nested ranges, then 50,000 short ones after the innermost has started: a point past the short ones is
    # held by the innermost nested range, 50,000 rows back; one near the end by the outermost alone, 250,000 back
    depth, flat = 200_000, 50_000
    start = np.concatenate((np.arange(depth), depth + 2 * np.arange(flat))).astype(np.int64)
    end = np.concatenate((3 * depth + 4 * flat - np.arange(depth), depth + 2 * np.arange(flat) + 1)).astype(np.int64)
    rows = np.arange(start.size, dtype=np.int64)
    points = np.array([depth + 2 * flat + 10, 3 * depth + 4 * flat - 1, depth - 1, -1], dtype=np.int64)
    got = hostwork.innermost(start, end, rows, points)
    assert got.tolist() == [depth - 1, 0, depth - 1, -1]
    assert got.tolist() == innermost_sweep(start, end, rows, points).tolist()
