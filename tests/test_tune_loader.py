"""``tune loader`` on a real Dataset whose items cost a known time: more workers must help up to the cores."""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path

import pytest

import fixtures_datasets
from fixtures_datasets import SleepyDataset, make_instant
from gpuidle import api
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.probes import loader, loader_choice, loader_measure
from gpuidle.probes.loader_measure import LoaderConfig, LoaderPoint
from gpuidle.report.bench import render, render_loader
from gpuidle.report.common import RenderOptions

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
        assert p.batches >= loader_measure.MIN_BATCHES
        assert p.samples_per_s == pytest.approx((p.batches_per_s or 0) * 4)
        assert p.startup_s > 0  # reported apart from the rate


def test_the_smallest_setting_that_reaches_the_target(sweep: loader.LoaderResult) -> None:
    target = 1.3 * rate(sweep, 0)  # one worker is no faster than the main process; two are
    best, reaches = loader_choice.recommend(sweep.points, target)
    assert reaches is True
    assert best is not None
    assert best.config.num_workers == 2
    best, reaches = loader_choice.recommend(sweep.points, 10 * rate(sweep, 2))
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
    narrow = render_loader(sweep, RenderOptions(width=60))  # the setting to paste is one line, whole, at any width
    assert f"  {sweep.snippet}" in narrow.splitlines()


def _point(workers: int, rate: float, over: bool = False, prefetch: int | None = None) -> LoaderPoint:
    cfg = LoaderConfig(workers, prefetch_factor=prefetch or (2 if workers else None))
    return LoaderPoint(cfg, 0.1, 10, 1.0, rate, rate * 8, over)


def test_recommend_by_hand() -> None:
    points = [_point(0, 10.0), _point(1, 19.0), _point(2, 36.0), _point(4, 37.0), _point(8, 37.5, over=True)]
    best, reaches = loader_choice.recommend(points, None)  # within 5 % of 37.5 (35.625): 2 workers
    assert best is not None
    assert best.config.num_workers == 2
    assert reaches is None
    best, reaches = loader_choice.recommend(points, 18.0)
    assert best is not None
    assert best.config.num_workers == 1
    assert reaches is True
    best, _ = loader_choice.recommend(points, 37.2)  # only the oversubscribed setting reaches it
    assert best is not None
    assert best.config.num_workers == 8
    best, _ = loader_choice.recommend([_point(2, 30.0, prefetch=4), _point(2, 30.0)], 20.0)
    assert best is not None
    assert best.config.prefetch_factor == 2
    assert loader_choice.recommend([], 1.0) == (None, None)


def test_more_processes_than_cores_alone_is_no_contention_warning() -> None:
    r = loader.tune_loader(make_instant(), batch_size=8, budget_s=1.0, workers=[2], local_ranks=2, cores=2,
                           variants=False)
    assert r.points[0].oversubscribed          # 2 workers × 2 ranks > 2 cores, by count
    assert not r.points[0].contended           # nothing measured before it to fall against
    assert not any("contend" in w for w in r.warnings)
    assert any("measured for one rank" in n for n in r.notes)


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


# -- the serial case, steady state, the budget, past the cores ---------------------------

LOAD_S = fixtures_datasets.ITEM_S * 4
"""The known work of one batch of 4 sleepy items: 32 ms, so one process loads at most 31.25 batches/s."""


def test_serial_step_rate_by_hand() -> None:
    # the numbers: a loader at 12.1 batches/s with 105.8 ms of compute per step
    assert loader_choice.step_rate(12.1, 0, 1 / 0.1058) == pytest.approx(1 / (1 / 12.1 + 0.1058))   # 5.31 steps/s
    assert loader_choice.step_rate(12.1, 0, 1 / 0.1058) == pytest.approx(5.31, abs=0.01)
    assert loader_choice.step_rate(9.3, 1, 1 / 0.1058) == 9.3
    assert loader_choice.step_rate(20.0, 2, 9.45) == 9.45


def test_zero_workers_never_reaches_a_target_it_cannot() -> None:
    points = [_point(0, 12.1), _point(1, 9.3), _point(2, 18.0)]
    best, reaches = loader_choice.recommend(points, 9.45)        # 0 workers: 5.31 steps/s, not 9.45
    assert best is not None
    assert (best.config.num_workers, reaches) == (2, True)
    best, reaches = loader_choice.recommend([_point(0, 12.1), _point(1, 9.3)], 9.45)
    assert best is not None
    assert (best.config.num_workers, reaches) == (1, False)  # 9.3 steps/s beats the serial 5.31


def test_zero_workers_within_five_percent_is_not_chosen_without_a_target() -> None:
    best, _ = loader_choice.recommend([_point(0, 36.0), _point(1, 19.0), _point(2, 37.0)], None)
    assert best is not None
    assert best.config.num_workers == 2                   # 0 workers would add 27.8 ms to every step
    best, _ = loader_choice.recommend([_point(0, 500.0), _point(1, 60.0), _point(2, 110.0)], None)
    assert best is not None
    assert best.config.num_workers == 0                   # workers only slow this one down


def test_fewest_workers_within_noise_of_the_best() -> None:
    noisy = [_point(2, 30.0), _point(4, 33.0)]
    noisy[0].noise = noisy[1].noise = 0.05                # 2 σ of the combined noise: 14 %
    best, _ = loader_choice.recommend(noisy, None)
    assert best is not None
    assert best.config.num_workers == 2


def test_steady_rate_counts_whole_rounds() -> None:
    # two workers deliver in pairs every 100 ms: 20 batches/s, however the window ends
    stamps = [t for k in range(12) for t in (0.1 * k, 0.1 * k + 0.001)][:-1]
    rate, n, secs, noise = loader_measure.steady_rate(stamps, 0, 2)
    assert n % 2 == 0
    assert rate == pytest.approx(n / secs)
    assert rate == pytest.approx(20.0, rel=0.02)
    assert noise is not None
    assert noise < 0.01
    naive = 3 / (stamps[3] - stamps[0])                   # 3 batches, as before: 29.7 batches/s
    assert naive > 1.4 * rate


def test_a_measured_rate_matches_the_serial_model() -> None:
    target = 1 / LOAD_S                                   # compute as long as loading: 31.25 steps/s at best
    r = loader.tune_loader(SleepyDataset(), batch_size=4, budget_s=3.0, workers=[0, 2], cores=2, variants=False,
                           target_batches_per_s=target)
    zero = next(p for p in r.points if p.config.num_workers == 0)
    assert zero.batches_per_s is not None
    assert zero.batches_per_s < 1 / LOAD_S                # sleeping 32 ms a batch: under 31.25 batches/s
    assert zero.batches_per_s > 0.6 / LOAD_S
    assert zero.step_per_s == pytest.approx(1 / (1 / zero.batches_per_s + 1 / target))   # about half the target
    assert zero.step_per_s < 0.55 * target
    assert r.recommended is not None
    assert r.recommended.num_workers == 2
    assert zero.batches >= loader_measure.MIN_BATCHES
    two = next(p for p in r.points if p.config.num_workers == 2)
    assert two.batches >= loader_measure.PER_WORKER * 2
    assert two.batches % 2 == 0


class _Clock:
    """Every reading is 0.4 s after the one before: start-up and batches are slow, the budget runs out."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.4
        return self.t


def test_nothing_starts_after_the_budget() -> None:
    r = loader.tune_loader(make_instant(), batch_size=8, budget_s=1.5, workers=[0, 1, 2], cores=2, variants=True,
                           clock=_Clock())
    assert [p.config.num_workers for p in r.points] == [0]
    assert r.persistent is None
    assert any("budget was spent" in n and "num_workers=1" in n for n in r.notes)


def test_io_bound_sweep_goes_past_the_cores() -> None:
    r = loader.tune_loader(SleepyDataset(), batch_size=4, budget_s=8.0, cores=1, variants=False)
    swept = [p.config.num_workers for p in r.points]
    assert swept[:2] == [0, 1]
    assert max(swept) >= 4                                # past the 1 core: sleeping workers scale
    assert rate(r, 4) > 2.5 * rate(r, 1)                  # 4 workers: near 4 × 31.25 batches/s
    assert rate(r, 4) < 4 / LOAD_S
    assert not any(p.contended for p in r.points)
    assert not any("contend" in w for w in r.warnings)
    assert any("swept past the 1 cores" in n for n in r.notes)
    assert r.recommended is not None
    assert r.recommended.num_workers >= 4


def test_contention_needs_the_numbers() -> None:
    before = _point(2, 40.0)
    assert loader_choice.contended(_point(4, 42.0, over=True), before)       # 10.5 per worker, was 20
    assert not loader_choice.contended(_point(4, 78.0, over=True), before)   # 19.5 per worker: scales
    assert not loader_choice.contended(_point(4, 42.0), before)              # within the cores: not oversubscribed


def test_torchs_worker_warning_is_said_once() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = loader.tune_loader(make_instant(), batch_size=8, budget_s=1.0, workers=[64], cores=64, variants=False)
    assert not [w for w in seen if "worker" in str(w.message)]
    said = [n for n in r.notes if "torch warned" in n]
    assert len(said) == 1
