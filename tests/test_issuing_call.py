"""Which collective call issued each collective kernel, all launches at once, against the former call-by-call loop.

The loop (kept here as the reference) asks, for each launch, every call on its thread whose range contains it,
calls that name their collective first, then those that know their size; random nested, overlapping and touching
calls on a few threads, and the real traces with collectives, must give the same call for every kernel.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import DATA
from gpuidle.analysis import comm
from gpuidle.analysis.links import launcher_rows
from gpuidle.model import DeviceOpKind
from gpuidle.sources import kineto


def one_by_one(tl: Any, launchers: np.ndarray, rows: np.ndarray) -> np.ndarray:
    calls, host = tl.collectives, tl.host
    out = np.full(rows.size, -1, dtype=np.int64)
    if len(calls) == 0 or rows.size == 0:
        return out
    named = np.array([bool(c) for c in calls.collective], dtype=bool)
    sized = (calls.in_bytes >= 0) | (calls.out_bytes >= 0)
    order = np.argsort(2 * ~named + ~sized, kind="stable")  # calls that name their collective, then sized ones
    h = calls.host_index[order]
    c_thread, c_start, c_end = host.thread[h], host.start[h], host.end[h]
    launch = launchers[rows]
    for i in np.flatnonzero(launch >= 0):
        t, th = host.start[launch[i]], host.thread[launch[i]]
        hit = np.flatnonzero((c_thread == th) & (c_start <= t) & (c_end >= t))
        if hit.size:
            out[i] = order[hit[0]]
    return out


class Calls(SimpleNamespace):
    def __len__(self) -> int:
        return int(self.host_index.size)


@pytest.mark.parametrize("seed", range(200))
def test_random_calls_and_launches(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    start = np.array([rng.randrange(-20, 60) for _ in range(n)], dtype=np.int64)
    end = start + np.array([rng.choice([0, 1, 2, 5, 9, 20, -2]) for _ in range(n)], dtype=np.int64)
    host = SimpleNamespace(thread=np.array([rng.randrange(3) for _ in range(n)], dtype=np.int32), start=start,
                           end=end)
    m = rng.randint(0, n)
    index = np.array(rng.sample(range(n), m), dtype=np.int64)
    sized = np.array([rng.choice([-1, 64, 1024]) for _ in range(m)], dtype=np.int64)
    named = [rng.choice(["", "", "all_to_all", "allreduce"]) for _ in range(m)]
    tl = SimpleNamespace(host=host, collectives=Calls(host_index=index, in_bytes=sized, collective=named,
                                                      out_bytes=np.where(sized > 0, -1, sized)))
    k = rng.randint(0, 30)
    launchers = np.array([rng.randrange(-1, n) for _ in range(k)], dtype=np.int64)
    rows = np.arange(k, dtype=np.int64)
    if rng.random() < 0.5:  # kernels in any order
        rows = rows[::-1].copy()
    assert comm._issuing_call(tl, launchers, rows).tolist() == one_by_one(tl, launchers, rows).tolist()


@pytest.mark.parametrize("name", ["negative_queue_length_values_check__rank0.json.gz",
                                  "nccl_parser_config__nccl_data.json.gz", "trace_filter__sampled_rank-0.json.gz"])
def test_real_traces(name: str) -> None:
    tl = kineto.read(str(DATA / name))
    launchers = launcher_rows(tl)
    rows = np.flatnonzero(tl.device_ops.kind == DeviceOpKind.COLLECTIVE)
    got = comm._issuing_call(tl, launchers, rows)
    assert got.tolist() == one_by_one(tl, launchers, rows).tolist()
    assert (got >= 0).sum() >= 10
