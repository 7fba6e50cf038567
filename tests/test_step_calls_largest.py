"""Each step's largest call, picked in one pass, is the one a loop over (step, call) pairs picks."""

from __future__ import annotations

import random

import numpy as np

from gpuidle.analysis.step_calls import _largest_per_step


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
