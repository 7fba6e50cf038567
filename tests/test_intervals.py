"""The interval algebra every cause's time comes from, against plain per-nanosecond references.

Random small sets (overlapping, nested, touching, zero-length, repeated) on a short integer axis, where the
reference can look at every nanosecond one by one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpuidle.analysis import intervals as iv

AXIS = 60


def random_intervals(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
    starts = [rng.randrange(AXIS) for _ in range(n)]
    ends = [s + rng.choice([0, 0, 1, 2, 3, 7, 15, -4]) for s in starts]  # some empty, some reversed (none)
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


def covered_ns(starts: np.ndarray, ends: np.ndarray) -> set[int]:
    return {t for s, e in zip(starts.tolist(), ends.tolist(), strict=True) for t in range(s, e)}


@pytest.mark.parametrize("halves", [False, True], ids=["one-piece", "in-halves"])
@pytest.mark.parametrize("seed", range(200))
def test_union_and_labels_match_a_nanosecond_reference(
    seed: int, halves: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if halves:  # a big labelling's path, on every input: two halves on two threads
        monkeypatch.setattr(iv, "SPLIT_FROM", 0)
        monkeypatch.setattr(iv, "cores_for_one_input", lambda: 2)
    rng = random.Random(seed)
    raw = random_intervals(rng, rng.randint(0, 8))
    base = iv.union(*raw)
    assert covered_ns(*base) == covered_ns(*raw)
    # a set: sorted, disjoint, not touching, non-empty
    assert np.all(base[1] > base[0])
    assert np.all(base[0][1:] > base[1][:-1])

    layers = [random_intervals(rng, rng.randint(0, 10)) for _ in range(rng.randint(0, 4))]
    points = np.array(sorted(rng.sample(range(AXIS + 20), rng.randint(1, 30))), dtype=np.int64)
    assert iv.covered(base, points).tolist() == [p in covered_ns(*base) for p in points.tolist()]

    extra = np.array(sorted(rng.sample(range(AXIS), rng.randint(0, 5))), dtype=np.int64)
    covers = [covered_ns(s, e) for s, e in layers]
    for cut in (base, raw):  # a set, or the raw intervals it is the union of (overlapping, empty, reversed)
        seg_s, seg_e, label = iv.label_segments(cut, layers, extra_points=extra)
        # the segments tile the base exactly, in order, cut at every extra point
        assert covered_ns(seg_s, seg_e) == covered_ns(*base)
        assert int((seg_e - seg_s).sum()) == iv.total(base)
        assert np.all(seg_s[1:] >= seg_e[:-1])
        assert not any(s < x < e for s, e in zip(seg_s.tolist(), seg_e.tolist(), strict=True) for x in extra.tolist())
        # each nanosecond of a segment carries the first layer that covers it (len(layers): none)
        for s, e, lab in zip(seg_s.tolist(), seg_e.tolist(), label.tolist(), strict=True):
            for t in range(s, e):
                assert lab == next((k for k, c in enumerate(covers) if t in c), len(layers)), (s, e, t)
