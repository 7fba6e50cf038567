"""``tune loader`` on a real Dataset whose items cost a known time: more workers must help up to the cores."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from fixtures_datasets import SleepyDataset, make_instant
from gpuidle import api
from gpuidle.bench import loader
from gpuidle.bench.loader import LoaderConfig, LoaderPoint
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.report.bench import render

EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"


@pytest.fixture(scope="module")
def sweep() -> loader.LoaderResult:
    # 8 ms per item, 4 items a batch: 32 ms of work per batch, so about 31 batches/s per worker
    return loader.tune_loader(SleepyDataset(), batch_size=4, budget_s=3.0, workers=[0, 1, 2], cores=2,
                              variants=False)


def rate(r: loader.LoaderResult, workers: int) -> float:
    p = next(p for p in r.points if p.config.num_workers == workers)
    assert p.batches_per_s is not None
    return p.batches_per_s


def test_more_workers_help_up_to_the_cores(sweep: loader.LoaderResult) -> None:
    assert [p.config.num_workers for p in sweep.points] == [0, 1, 2]
    assert rate(sweep, 2) > 1.4 * rate(sweep, 0)
    assert rate(sweep, 2) > 1.4 * rate(sweep, 1)
    for p in sweep.points:
        assert p.error is None
        assert not p.oversubscribed
        assert p.batches >= loader.MIN_BATCHES
        assert p.samples_per_s == pytest.approx((p.batches_per_s or 0) * 4)
        assert p.startup_s > 0  # reported apart from the rate


def test_the_smallest_setting_that_reaches_the_target(sweep: loader.LoaderResult) -> None:
    target = 1.3 * rate(sweep, 0)  # one worker is no faster than the main process; two are
    best, reaches = loader.recommend(sweep.points, target)
    assert reaches is True
    assert best is not None
    assert best.config.num_workers == 2
    best, reaches = loader.recommend(sweep.points, 10 * rate(sweep, 2))
    assert reaches is False
    assert best is not None
    assert best.config.num_workers == 2


def test_the_result_recommends_and_renders(sweep: loader.LoaderResult) -> None:
    assert sweep.schema == "gpuidle.bench.loader/1"
    assert sweep.recommended is not None
    assert sweep.recommended.num_workers == 2
    assert sweep.snippet == ("DataLoader(dataset, batch_size=4, num_workers=2, pin_memory=False, prefetch_factor=2, "
                             "persistent_workers=False)")
    text = render(sweep)
    assert "batches/s vs num_workers" in text
    assert "█" in text
    assert json.loads(render(sweep, fmt="json"))["schema"] == "gpuidle.bench.loader/1"


def _point(workers: int, rate: float, over: bool = False, prefetch: int | None = None) -> LoaderPoint:
    cfg = LoaderConfig(workers, prefetch_factor=prefetch or (2 if workers else None))
    return LoaderPoint(cfg, 0.1, 10, 1.0, rate, rate * 8, over)


def test_recommend_by_hand() -> None:
    points = [_point(0, 10.0), _point(1, 19.0), _point(2, 36.0), _point(4, 37.0), _point(8, 37.5, over=True)]
    best, reaches = loader.recommend(points, None)  # within 5 % of 37.5 (35.625): 2 workers
    assert best is not None
    assert best.config.num_workers == 2
    assert reaches is None
    best, reaches = loader.recommend(points, 18.0)
    assert best is not None
    assert best.config.num_workers == 1
    assert reaches is True
    best, _ = loader.recommend(points, 37.2)  # only the oversubscribed setting reaches it
    assert best is not None
    assert best.config.num_workers == 8
    best, _ = loader.recommend([_point(2, 30.0, prefetch=4), _point(2, 30.0)], 20.0)
    assert best is not None
    assert best.config.prefetch_factor == 2
    assert loader.recommend([], 1.0) == (None, None)


def test_oversubscription_is_flagged_and_warned() -> None:
    r = loader.tune_loader(make_instant(), batch_size=8, budget_s=1.0, workers=[2], local_ranks=2, cores=2,
                           variants=False)
    assert r.points[0].oversubscribed
    assert any("oversubscribed" in w for w in r.warnings)
    assert any("oversubscribe" in n for n in r.notes)


def test_variants_and_persistent_workers() -> None:
    r = loader.tune_loader(make_instant(), batch_size=8, budget_s=1.5, workers=[1], cores=2, variants=True)
    # the winner of the sweep is tried with prefetch_factor 4; no GPU here, so no pin_memory variant
    assert [p.config.prefetch_factor for p in r.points] == [2, 4]
    assert any("pin_memory not measured" in n for n in r.notes)
    assert r.persistent is not None
    assert r.persistent.fresh_start_s > 0
    assert r.persistent.persistent_start_s > 0
    assert r.persistent.helps == (r.persistent.persistent_start_s < 0.5 * r.persistent.fresh_start_s)


def test_target_from_a_trace_report() -> None:
    report = api.analyze([str(EXAMPLE)])
    busy = [s.busy_s for s in report.ranks[0].steps]
    assert loader.target_from_report(report) == pytest.approx(1 / statistics.median(busy), rel=1e-12)


@pytest.mark.parametrize(("spec", "message"), [
    ("fixtures_datasets", "not module:name"),
    ("no_such_module_here:make", "cannot import"),
    ("fixtures_datasets:nothing", "has no 'nothing'"),
    ("fixtures_datasets:not_a_dataset", "not a Dataset"),
])
def test_bad_factories(spec: str, message: str) -> None:
    with pytest.raises(GpuidleError, match=message):
        loader.make_dataset(spec)


def test_a_dataset_that_raises_is_one_error() -> None:
    with pytest.raises(GpuidleError, match="KeyError"):
        loader.tune_loader(loader.make_dataset("fixtures_datasets:make_broken"), batch_size=2, budget_s=1.0,
                           workers=[0])


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["tune", "loader", "--dataset", "fixtures_datasets:make_instant", "--batch-size", "4",
               "--collate", "fixtures_datasets:stack", "--sampler", "fixtures_datasets:first_half_sampler",
               "--budget-s", "1", "--workers", "0,1", "--no-variants", "--target-batches-per-s", "5", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["config"]["num_workers"] for p in out["points"]] == [0, 1]
    assert out["target_batches_per_s"] == 5.0
    assert out["reaches_target"] is True
    assert main(["tune", "loader", "--dataset", "fixtures_datasets:make_broken", "--batch-size", "2"]) == 2
    assert capsys.readouterr().err.startswith("gpuidle: error: the dataset failed")
