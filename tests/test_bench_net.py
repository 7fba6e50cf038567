"""``bench net`` for real on 2 and 3 gloo ranks, and the slow-link rule on hand-made links."""

from __future__ import annotations

import json
import os

import msgspec
import numpy as np
import pytest

from gpuidle.cli import main
from gpuidle.probes import net
from gpuidle.report.bench import render


def link(a: int, b: int, lat_us: float, bw: float, host: str = "n") -> net.Link:
    return net.Link(a, b, f"{host}{a}", f"{host}{b}", lat_us, bw)


def test_two_ranks_one_link() -> None:
    r = net.run_net(net.NetConfig(bytes=256 << 10, iters=3, warmup=1, runs=3), nproc=2, device="cpu")
    assert r is not None
    assert r.schema == "gpuidle.bench.net/1"
    assert (r.world_size, r.nodes, r.level) == (2, 1, "rank")
    assert [(x.a, x.b) for x in r.links] == [(0, 1)]
    x = r.links[0]
    assert x.latency_us > 0
    assert x.bandwidth_gbps > 0
    assert r.slowest == x
    assert any("one node" in n for n in r.notes)
    assert msgspec.json.decode(render(r, fmt="json"), type=net.NetResult) == r
    # latency: the median of the runs, with the fastest and the 90th percentile; as many again when they disagree
    lats = x.latency_runs_us
    again = np.percentile(lats[:3], 90) / min(lats[:3]) > 2.0
    assert len(lats) == (6 if again else 3)
    assert x.latency_us == pytest.approx(float(np.median(lats)))
    assert x.latency_min_us == pytest.approx(min(lats))
    assert x.latency_p90_us == pytest.approx(float(np.percentile(lats, 90)))
    assert (r.runs, r.threads_per_rank) == (3, int(os.environ.get("OMP_NUM_THREADS", "1")))
    assert "slowest link: rank 0" in render(r)


def test_three_ranks_every_pair() -> None:
    r = net.run_net(net.NetConfig(bytes=64 << 10, iters=2, warmup=1), nproc=3, device="cpu")
    assert r is not None
    assert [(x.a, x.b) for x in r.links] == [(0, 1), (0, 2), (1, 2)]


def test_endpoints_pick_the_first_rank_of_each_node() -> None:
    hosts = ["a", "a", "b", "b", "c", "c"]
    assert net.endpoints(hosts, "auto") == ([0, 2, 4], "node")
    assert net.endpoints(hosts, "rank") == ([0, 1, 2, 3, 4, 5], "rank")
    assert net.endpoints(["a", "a"], "auto") == ([0, 1], "rank")
    assert net.endpoints(["b", "a", "b", "a"], "node") == ([0, 1], "node")


def test_the_slow_link_is_named_with_its_numbers() -> None:
    links = [link(0, 1, 20.0, 12.0), link(0, 2, 21.0, 11.0), link(1, 2, 19.0, 3.0), link(0, 3, 200.0, 12.5),
             link(1, 3, 22.0, 11.5), link(2, 3, 20.0, 12.0)]
    r = net.summarize_links(links, backend="nccl", device="cuda", world_size=8, nodes=4, level="node",
                            nbytes=64 << 20, latency_bytes=8, iters=20, notes=[])
    # median bandwidth (11.5 + 12) / 2 = 11.75: under half of it is 3.0 only; median latency 20.5, over twice: 200
    assert r.median_bandwidth_gbps == 11.75
    assert r.median_latency_us == 20.5
    slow = {(x.a, x.b): x.why for x in r.links if x.slow}
    assert set(slow) == {(1, 2), (0, 3)}
    assert "under half the median link's 11.8" in (slow[(1, 2)] or "")
    assert "latency 200.0 µs is over twice the median link's 20.5 µs" in (slow[(0, 3)] or "")
    assert r.slowest is not None
    assert (r.slowest.a, r.slowest.b) == (1, 2)


def test_guide_thresholds_apply_to_a_single_link() -> None:
    (x,) = net.flag_slow([link(0, 1, 1500.0, 0.5)])
    assert x.slow
    assert "latency 1.50 ms is over the guide's 1 ms" in (x.why or "")  # never 1.5e+03 µs
    assert "under the guide's 10 Gbit/s" in (x.why or "")
    (y,) = net.flag_slow([link(0, 1, 10.0, 20.0)])
    assert not y.slow
    assert y.why is None


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "net", "--nproc", "2", "--device", "cpu", "--bytes", "64K", "--iters", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes"] == 64 << 10
    assert len(out["links"]) == 1
