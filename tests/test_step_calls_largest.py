"""Each step's largest call, picked in one pass, is the one a loop over (step, call) pairs picks; the calls
worth searching are those a loop over points finds holding one."""

from __future__ import annotations

import random

import numpy as np

from gpuidle.analysis.step_calls import _covering, _largest_per_step


def test_the_largest_per_step_is_the_loops() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 80)
        step = np.array([rng.randrange(4) for _ in range(n)], dtype=np.int64)
        row = np.array([rng.randrange(6) for _ in range(n)], dtype=np.int64)
        length = np.array([rng.choice([1, 2, 3, 5]) for _ in range(n)], dtype=np.int64)
        covered: dict[tuple[int, int], float] = {}
        for s, r, w in zip(step.tolist(), row.tolist(), length.tolist(), strict=True):
            covered[s, r] = covered.get((s, r), 0.0) + w
        expected = []
        for s in sorted({s for s, _ in covered}):
            best = max((c, -r) for (t, r), c in covered.items() if t == s)
            expected.append((s, -best[1], best[0]))
        assert _largest_per_step(step, row, length, 6) == expected


def test_the_calls_holding_a_point_are_the_loops() -> None:
    rng = random.Random(11)
    for _ in range(500):
        n = rng.randint(0, 40)
        start = np.array([rng.randrange(30) for _ in range(n)], dtype=np.int64)
        end = start + np.array([rng.randrange(6) for _ in range(n)], dtype=np.int64)  # empty ranges too
        rows = np.array(sorted(rng.sample(range(n), rng.randint(0, n))), dtype=np.int64)
        points = np.sort(np.array([rng.randrange(-2, 38) for _ in range(rng.randint(0, 12))], dtype=np.int64))
        expected = [r for r in rows.tolist() if any(start[r] <= p < end[r] for p in points.tolist())]
        assert _covering(start, end, rows, points).tolist() == expected
