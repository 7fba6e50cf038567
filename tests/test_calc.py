"""The calculator against hand-computed values, its edge cases, and ``gpuidle cost``."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest

from gpuidle import api
from gpuidle.advice import calc
from gpuidle.cli import main
from gpuidle.errors import GpuidleError

EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
EXACT = {"rel": 1e-12, "abs": 1e-12}


def line(lines: list[calc.CalcLine], name: str) -> calc.CalcLine:
    return next(x for x in lines if x.name == name)


def test_cost_of_the_issue_example() -> None:
    # 64 GPUs × 72 h = 4608 GPU-h; idle 45 % of it = 2073.6 GPU-h; × 2.5 = 5184
    # same work at 90 %: 72 × 0.55 / 0.9 = 44 h, saving 28 h = 1792 GPU-h = 4480
    r = calc.cost(64, 72, 0.55, 2.5, 0.9)
    assert r.gpu_hours == 4608
    assert r.wasted_gpu_hours == pytest.approx(2073.6, **EXACT)
    assert r.wasted_money == pytest.approx(5184.0, **EXACT)
    assert r.hours_at_target == pytest.approx(44.0, **EXACT)
    assert r.hours_saved == pytest.approx(28.0, **EXACT)
    assert r.gpu_hours_saved == pytest.approx(1792.0, **EXACT)
    assert r.money_saved == pytest.approx(4480.0, **EXACT)
    assert r.notes == []


def test_each_result_states_formula_and_rounding() -> None:
    r = calc.cost(64, 72, 0.55, 2.5, 0.9)
    assert [x.name for x in r.lines] == ["gpu_hours", "wasted_gpu_hours", "wasted_money", "hours_at_target",
                                         "hours_saved", "gpu_hours_saved", "money_saved"]
    wasted = line(r.lines, "wasted_gpu_hours")
    assert wasted.formula == "GPUs × hours × (1 − utilization)"
    assert wasted.worked == "64 × 72 × (1 − 0.55) = 2073.6"
    assert wasted.rounding == "shown to 0.1"
    assert wasted.shown == "2,073.6 GPU-h"
    money = line(r.lines, "money_saved")
    assert money.rounding == "shown to 0.01"
    assert money.shown == "4,480.00"
    assert line(r.lines, "hours_at_target").formula == "hours × utilization / target"
    assert all(x.formula and x.worked and x.rounding for x in r.lines)


def test_rounding_is_only_in_what_is_shown() -> None:
    r = calc.cost(3, 1, 1 / 3, 1.0)
    w = line(r.lines, "wasted_gpu_hours")
    assert w.value == pytest.approx(2.0, **EXACT)
    assert w.shown == "2.0 GPU-h"
    m = line(r.lines, "wasted_money")
    assert m.value == pytest.approx(2.0, **EXACT)
    r = calc.cost(1, 1, 0.12345, 1.0)
    assert line(r.lines, "wasted_money").value == pytest.approx(0.87655, **EXACT)
    assert line(r.lines, "wasted_money").shown == "0.88"


def test_full_utilization_wastes_nothing_and_saves_nothing() -> None:
    r = calc.cost(8, 10, 1.0, 2.0, 0.9)
    assert r.wasted_gpu_hours == 0.0
    assert r.wasted_money == 0.0
    assert r.hours_at_target == 10.0
    assert r.hours_saved == 0.0
    assert r.money_saved == 0.0
    assert any("nothing to save" in n for n in r.notes)


@pytest.mark.parametrize("target", [0.5, 0.8])
def test_target_at_or_below_current_saves_zero_never_negative(target: float) -> None:
    r = calc.cost(8, 10, 0.8, 2.0, target)
    assert r.hours_at_target == 10.0
    assert r.hours_saved == 0.0
    assert r.gpu_hours_saved == 0.0
    assert r.money_saved == 0.0
    assert math.copysign(1.0, r.hours_saved) == 1.0  # not -0.0 either
    assert line(r.lines, "hours_at_target").formula.startswith("hours (target ≤ utilization")


def test_zero_utilization_wastes_everything_but_has_no_time_at_target() -> None:
    r = calc.cost(8, 10, 0.0, 2.0)
    assert r.wasted_gpu_hours == 80.0
    assert r.wasted_money == 160.0
    with pytest.raises(GpuidleError, match="utilization 0"):
        calc.cost(8, 10, 0.0, 2.0, 0.9)


@pytest.mark.parametrize(("args", "message"), [
    ((8, 10, 1.2), "outside 0..1"),
    ((8, 10, -0.1), "outside 0..1"),
    ((0, 10, 0.5), "at least one GPU"),
    ((8, 0, 0.5), "above 0"),
    ((8, 10, 0.5, -1.0), "negative"),
    ((8, 10, 0.5, 1.0, 1.5), "outside 0..1"),
    ((8, 10, 0.5, 1.0, 0.0), "no target"),
])
def test_bad_inputs_are_clear_errors(args: tuple[float, ...], message: str) -> None:
    with pytest.raises(GpuidleError, match=message):
        calc.cost(*args)  # type: ignore[arg-type]


def test_existing_formulas() -> None:
    assert calc.wasted_gpu_hours(64, 72, 0.55) == pytest.approx(2073.6, **EXACT)
    assert calc.wasted_money(64, 72, 0.55, 2.5) == pytest.approx(5184.0, **EXACT)
    assert calc.hours_at_target(72, 0.55, 0.9) == pytest.approx(44.0, **EXACT)
    assert calc.hours_at_target(72, 0.95, 0.9) == 72
    assert calc.utilization_after(busy_s=0.5, window_s=1.0, idle_removed_s=0.25) == pytest.approx(2 / 3, **EXACT)
    assert calc.busbw(100.0, 1.75) == 175.0


def test_learning_rate_scaling() -> None:
    assert calc.scaled_lr(0.1, 256, 1024) == pytest.approx(0.4, **EXACT)
    assert calc.scaled_lr(0.1, 256, 1024, "sqrt") == pytest.approx(0.2, **EXACT)
    assert calc.scaled_lr(3e-4, 512, 128, "sqrt") == pytest.approx(1.5e-4, **EXACT)
    lines = calc.lr_lines(0.1, 256, 1024)
    assert [x.name for x in lines] == ["lr_linear", "lr_sqrt"]
    assert lines[0].worked == "0.1 × 1024 / 256 = 0.4"
    assert "Adam" in lines[1].formula
    assert lines[1].rounding == "shown to 4 significant digits"
    with pytest.raises(GpuidleError, match="positive"):
        calc.scaled_lr(0.1, 0, 1024)
    with pytest.raises(GpuidleError, match="unknown scaling rule"):
        calc.scaled_lr(0.1, 256, 1024, "cubic")
    with pytest.raises(GpuidleError, match="above 0"):
        calc.lr_lines(0.0, 256, 1024)


def test_accumulation_steps_round_up_and_say_so() -> None:
    assert calc.accumulation_steps(4096, 32, 64) == 2
    assert calc.accumulation_steps(4096, 48, 8) == 11  # 4096 / 384 = 10.67
    x = calc.accumulation_line(4096, 48, 8)
    assert x.value == 11
    assert x.rounding == "rounded up to a whole step: effective batch 4224"  # 11 × 48 × 8
    with pytest.raises(GpuidleError):
        calc.accumulation_steps(4096, 0)


@pytest.mark.parametrize(("collective", "n", "algbw", "expected"), [
    ("all_reduce", 8, 100.0, 175.0),       # 2 × 7 / 8 = 1.75
    ("all_reduce", 2, 10.0, 10.0),         # 2 × 1 / 2 = 1
    ("all_gather", 8, 100.0, 87.5),        # 7 / 8
    ("reduce_scatter", 4, 100.0, 75.0),    # 3 / 4
    ("all_to_all", 2, 50.0, 25.0),         # 1 / 2
    ("broadcast", 64, 30.0, 30.0),         # 1
])
def test_busbw_from_algbw(collective: str, n: int, algbw: float, expected: float) -> None:
    x = calc.busbw_line(collective, n, algbw)
    assert x.value == pytest.approx(expected, **EXACT)
    assert x.unit == "GB/s"
    assert x.formula.startswith("algbw ×")


def test_busbw_unknown_collective() -> None:
    with pytest.raises(GpuidleError, match="unknown collective"):
        calc.busbw_line("gossip", 8, 1.0)


def test_cost_from_a_trace_report() -> None:
    report = api.analyze([str(EXAMPLE)])
    rank = report.ranks[0]
    devices = [msgspec.structs.replace(d, utilization=0.25) if d is rank.primary() else d for d in rank.devices]
    report = msgspec.structs.replace(report, ranks=[msgspec.structs.replace(rank, devices=devices)])
    r = calc.cost_from_report(report, price_per_gpu_hour=2.0, hours=10.0, target=0.5)
    assert r.gpus == 1  # the one GPU with work in the window: rank 0 of a two-rank job, said in the notes
    assert any("1 of the job's 2 ranks" in n for n in r.notes)
    assert r.wasted_gpu_hours == pytest.approx(7.5, **EXACT)  # 1 × 10 × 0.75
    assert r.hours_at_target == pytest.approx(5.0, **EXACT)   # 10 × 0.25 / 0.5
    assert r.money_saved == pytest.approx(10.0, **EXACT)        # 1 × 5 × 2
    whole = calc.cost_from_report(report, price_per_gpu_hour=2.0, hours=10.0, target=0.5, gpus=2)
    assert whole.wasted_gpu_hours == pytest.approx(15.0, **EXACT)  # --gpus 2: the whole job, 2 × 10 × 0.75
    assert not any("ranks" in n for n in whole.notes)


def test_cli_cost_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["cost", "--gpus", "64", "--hours", "72", "--utilization", "0.55", "--price-per-gpu-hour", "2.5",
               "--target", "0.9", "--lr", "0.1", "--batch", "256", "--new-batch", "1024", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "gpuidle.cost/2"
    assert out["cost"]["money_saved"] == pytest.approx(4480.0, **EXACT)
    assert [x["name"] for x in out["lines"]] == ["lr_linear", "lr_sqrt"]


def test_cli_cost_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--gpus", "8", "--hours", "10", "--utilization", "0.9", "--target", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "wasted gpu hours" in out
    assert "nothing to save" in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["cost"], "nothing to compute"),
    (["cost", "--gpus", "8"], "--hours, --utilization"),
    (["cost", "--gpus", "8", "--hours", "1", "--utilization", "1.5"], "outside 0..1"),
    (["cost", "--gpus", "8", "--hours", "1", "--utilization", "0", "--target", "0.9"], "utilization 0"),
    (["cost", "--lr", "0.1"], "--new-batch"),
    (["cost", "--algbw", "10"], "--ranks"),
])
def test_cli_cost_errors(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuidle: error: ")
    assert needle in err


def _worked_result(worked: str) -> Decimal:
    """The number after the last ``=`` of a worked line."""
    return Decimal(worked.rsplit("=", 1)[1].strip())


def test_worked_lines_reproduce_their_result_exactly() -> None:
    # every operand is printed in full and the printed result is the exact product
    r = calc.cost(3, 87654321100000000000.0, 0.123456789, 1.5, 0.9)
    h, u, p = Decimal("87654321100000000000"), Decimal("0.123456789"), Decimal("1.5")
    wasted = line(r.lines, "wasted_gpu_hours")
    assert wasted.worked == "3 × 87654321100000000000 × (1 − 0.123456789) = 230498400225057156300"
    assert _worked_result(wasted.worked) == 3 * h * (1 - u)
    money = line(r.lines, "wasted_money")
    assert _worked_result(money.worked) == 3 * h * (1 - u) * p
    assert "2048" not in money.shown  # no binary float noise: 87654321100000000000 is not 87654321100000002048
    assert line(r.lines, "gpu_hours").shown == "262,962,963,300,000,000,000.0 GPU-h"
    at = line(r.lines, "hours_at_target")
    q = _worked_result(at.worked)
    assert abs(q - h * u / Decimal("0.9")) <= abs(q) * Decimal("1e-14")  # the quotient to 15 digits
    saved = line(r.lines, "hours_saved")
    assert saved.worked == f"87654321100000000000 − {at.worked.rsplit('= ', 1)[1]} = {_worked_result(saved.worked)}"
    assert _worked_result(saved.worked) == h - q  # the rounded quotient is what the next line uses


def test_full_precision_inputs_are_printed_in_full() -> None:
    r = calc.cost(1, 1, 0.123456789, 1.0)
    assert line(r.lines, "wasted_money").worked == "1 × 1 × (1 − 0.123456789) × 1 = 0.876543211"
    assert line(r.lines, "wasted_money").value == 0.876543211


@pytest.mark.parametrize("kwargs", [
    {"hours": math.inf}, {"hours": math.nan}, {"price_per_gpu_hour": math.inf}, {"price_per_gpu_hour": math.nan},
])
def test_non_finite_inputs_are_refused(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {"gpus": 8, "hours": 10.0, "utilization": 0.5, "price_per_gpu_hour": 2.0, **kwargs}
    with pytest.raises(GpuidleError, match="finite"):
        calc.cost(**args)  # type: ignore[arg-type]


def test_results_beyond_float_range_are_refused() -> None:
    with pytest.raises(GpuidleError, match="beyond what can be computed"):
        calc.cost(64, 1e308, 0.5)


@pytest.mark.parametrize("argv", [
    ["--hours", "inf", "--utilization", "0.5"],
    ["--hours", "10", "--utilization", "0.5", "--price-per-gpu-hour", "nan"],
    ["--hours", "10", "--utilization", "0.5", "--price-per-gpu-hour", "inf"],
    ["--hours", "1e308", "--utilization", "0.5"],
])
def test_cli_refuses_non_finite_and_overflow(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--gpus", "64", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("gpuidle: error:")


def test_cli_gpus_is_the_world_size_of_other_formulas(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--gpus", "8", "--effective-batch", "4096", "--micro-batch", "48", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost"] is None
    assert out["lines"][0]["value"] == 11  # ⌈4096 / (48 × 8)⌉ = ⌈10.67⌉


def test_cli_one_gpu_is_singular(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--gpus", "1", "--hours", "10", "--utilization", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "1 GPU ×" in out
    assert "1 GPUs" not in out


def test_json_money_keys_are_currency_neutral(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--gpus", "2", "--hours", "10", "--utilization", "0.5", "--price-per-gpu-hour", "3",
                 "--target", "0.9", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert cost["wasted_money"] == 30.0                                  # 2 × 10 × 0.5 × 3
    assert cost["money_saved"] == pytest.approx(2 * (10 - 10 * 0.5 / 0.9) * 3, rel=1e-14)
    assert not any("usd" in k for k in cost)
