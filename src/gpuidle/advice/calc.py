"""The standard formulas behind every gain and cost gpuidle prints.

Each function states its formula; units are in the names (``_s`` seconds, ``_gbps``
gigabytes per second; money is in the user's currency, whatever the price was given in).
"""

from __future__ import annotations

import decimal
import math

import msgspec

from gpuidle.analysis import figures
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport, CalcLine, CostResult

TARGET_UTILIZATION = 0.9
"""The guide's goal: over 90 % utilization."""


def utilization_after(busy_s: float, window_s: float, idle_removed_s: float, busy_removed_s: float = 0.0) -> float:
    """Utilization once some idle (and/or busy) time is gone from every step.

    ``(busy - busy_removed) / (window - idle_removed - busy_removed)``.
    """
    busy = max(busy_s - busy_removed_s, 0.0)
    window = window_s - idle_removed_s - busy_removed_s
    return busy / window if window > 0 else 1.0


def busbw(algbw_gbps: float, factor: float) -> float:
    """nccl-tests: ``busbw = algbw * factor`` (factor from ``analysis.comm.bus_factor``)."""
    return algbw_gbps * factor


def wasted_gpu_hours(gpus: int, hours: float, utilization: float) -> float:
    """``GPUs * hours * (1 - utilization)``."""
    _check_utilization(utilization)
    return gpus * hours * (1.0 - utilization)


def hours_at_target(hours: float, utilization: float, target: float) -> float:
    """Same work at a higher utilization: ``hours * utilization / target``.

    A target at or below the current utilization saves nothing: the hours stay.
    """
    _check_utilization(utilization)
    _check_utilization(target)
    if target <= utilization or utilization == 0.0:
        return hours
    return hours * utilization / target


def scaled_lr(lr: float, batch_old: int, batch_new: int, rule: str = "linear") -> float:
    """Learning rate for a new batch size: linear ``lr * B_new / B_old``, or ``sqrt`` of that ratio."""
    if batch_old <= 0 or batch_new <= 0:
        raise GpuidleError("batch sizes must be positive")
    if rule not in ("linear", "sqrt"):
        raise GpuidleError(f"unknown scaling rule {rule!r}", "choose linear or sqrt")
    ratio = batch_new / batch_old
    return lr * (ratio if rule == "linear" else ratio ** 0.5)


def accumulation_steps(target_batch: int, micro_batch: int, world_size: int = 1) -> int:
    """Micro-batches per optimizer step for an effective batch: ``ceil(target / (micro * world))``."""
    if target_batch <= 0 or micro_batch <= 0 or world_size <= 0:
        raise GpuidleError("batch sizes and world size must be positive")
    return -(-target_batch // (micro_batch * world_size))


def _check_utilization(u: float) -> None:
    if not 0.0 <= u <= 1.0:
        raise GpuidleError(f"utilization {u} is outside 0..1", "give a fraction, e.g. 0.55 for 55 %")


# ----------------------------------------------------------------------------------
# Results that show their work: ``gpuidle cost`` and the cost lines of reports.
# ----------------------------------------------------------------------------------

MONEY = "money"
"""The unit of prices and costs: whatever currency the price was given in."""


class CalcReport(msgspec.Struct, kw_only=True):
    """``gpuidle cost``: the cost, and any of the other formulas asked for."""

    schema: str = "gpuidle.cost/2"
    cost: CostResult | None = None
    lines: list[CalcLine] = []
    notes: list[str] = []


def _num(x: float) -> str:
    """Numbers inside a worked formula: 6 significant digits (whole numbers above a million)."""
    return f"{x:.0f}" if abs(x) >= 1e6 else f"{x:.6g}"


# The cost is computed in exact decimals from the numbers as given (a float's shortest
# repr), so each worked line prints exactly the operands and the result it computed, and
# huge inputs carry no binary float noise. Divisions round to 15 significant digits; the
# rounded quotient is what the later lines use and print.
_EXACT = decimal.Context(prec=400, Emax=999_999, Emin=-999_999, traps=[decimal.InvalidOperation])
_QUOTIENT_DIGITS = 15


def _dec(x: float, flag: str) -> decimal.Decimal:
    if not math.isfinite(x):
        raise GpuidleError(f"{flag} {x}: must be a finite number")
    return decimal.Decimal(repr(float(x)))


def _exact(d: decimal.Decimal) -> str:
    """A decimal exactly, plain up to 21 integer digits, else in scientific notation."""
    d = d.normalize(_EXACT)
    if d == 0:
        return "0"
    return f"{d:f}" if -7 < d.adjusted() < 21 else f"{d:E}"


def _quotient(a: decimal.Decimal, b: decimal.Decimal) -> decimal.Decimal:
    q = _EXACT.divide(a, b)
    return q.quantize(decimal.Decimal(1).scaleb(q.adjusted() - _QUOTIENT_DIGITS + 1), context=_EXACT)


def _float(name: str, d: decimal.Decimal) -> float:
    """The float of an exact result; one beyond float range is an input error, not an inf."""
    v = float(d)
    if not math.isfinite(v):
        raise GpuidleError(f"{name.replace('_', ' ')} is {_exact(d)}: beyond what can be computed in floats",
                           "check --gpus, --hours and --price-per-gpu-hour")
    return v


def _line(name: str, d: decimal.Decimal, unit: str, formula: str, worked: str, places: int) -> CalcLine:
    value = _float(name, d)
    if d.adjusted() < 21:
        shown = f"{d.quantize(decimal.Decimal(1).scaleb(-places), context=_EXACT):,.{places}f}"
        rounding = "shown to 0.1" if places == 1 else "shown to 0.01"
    else:
        shown, rounding = f"{d:.6E}", "shown to 7 significant digits"
    label = unit if unit != MONEY else ""
    return CalcLine(name, value, unit, formula, f"{worked} = {_exact(d)}", rounding,
                    f"{shown} {label}".rstrip())


def wasted_money(gpus: int, hours: float, utilization: float, price_per_gpu_hour: float) -> float:
    """``GPUs * hours * (1 - utilization) * price``."""
    if price_per_gpu_hour < 0:
        raise GpuidleError(f"price {price_per_gpu_hour} is negative")
    return wasted_gpu_hours(gpus, hours, utilization) * price_per_gpu_hour


def cost(gpus: int, hours: float, utilization: float, price_per_gpu_hour: float | None = None,
         target: float | None = None) -> CostResult:
    """GPU-hours and money lost to idle time, and what reaching ``target`` utilization saves.

    Same work at a higher utilization takes ``hours * utilization / target``; a target at or
    below the current utilization saves exactly zero. Utilization 0 with a target is an error:
    no work was done, so there is no "same work" to time.
    """
    if gpus < 1:
        raise GpuidleError(f"--gpus {gpus}: need at least one GPU")
    h = _dec(hours, "--hours")
    if not h > 0:
        raise GpuidleError(f"--hours {hours}: must be above 0")
    u = _dec(utilization, "--utilization")
    _check_utilization(utilization)
    p = None if price_per_gpu_hour is None else _dec(price_per_gpu_hour, "--price-per-gpu-hour")
    if p is not None and p < 0:
        raise GpuidleError(f"--price-per-gpu-hour {price_per_gpu_hour} is negative")
    t = None if target is None else _dec(target, "--target")
    if target is not None:
        _check_utilization(target)
        if target == 0:
            raise GpuidleError("a target utilization of 0 is no target", "give e.g. --target 0.9")
        if utilization == 0:
            raise GpuidleError("utilization 0: the GPUs did no work, so the time for the same work at a target "
                               "is undefined", "give the measured utilization (gpuidle analyze reports it)")
    g = decimal.Decimal(gpus)
    mul = _EXACT.multiply
    gh = mul(g, h)
    idle = _EXACT.subtract(decimal.Decimal(1), u)
    wasted = mul(gh, idle)
    hs, us = _exact(h), _exact(u)
    lines = [
        _line("gpu_hours", gh, "GPU-h", "GPUs × hours", f"{gpus} × {hs}", 1),
        _line("wasted_gpu_hours", wasted, "GPU-h", "GPUs × hours × (1 − utilization)",
              f"{gpus} × {hs} × (1 − {us})", 1),
    ]
    notes: list[str] = []
    money = at = saved = gh_saved = money_saved = None
    if p is not None:
        money = mul(wasted, p)
        lines.append(_line("wasted_money", money, MONEY, "GPUs × hours × (1 − utilization) × price",
                           f"{gpus} × {hs} × (1 − {us}) × {_exact(p)}", 2))
    if t is not None:
        if t <= u:
            at = h
            notes.append(f"target {target:.1%} is at or below the current {utilization:.1%}: nothing to save")
            lines.append(_line("hours_at_target", at, "h", "hours (target ≤ utilization: unchanged)", hs, 1))
        else:
            at = _quotient(mul(h, u), t)
            lines.append(_line("hours_at_target", at, "h", "hours × utilization / target",
                               f"{hs} × {us} / {_exact(t)}", 1))
        saved = _EXACT.subtract(h, at)
        lines.append(_line("hours_saved", saved, "h", "hours − hours_at_target", f"{hs} − {_exact(at)}", 1))
        gh_saved = mul(g, saved)
        lines.append(_line("gpu_hours_saved", gh_saved, "GPU-h", "GPUs × hours_saved",
                           f"{gpus} × {_exact(saved)}", 1))
        if p is not None:
            money_saved = mul(gh_saved, p)
            lines.append(_line("money_saved", money_saved, MONEY, "GPUs × hours_saved × price",
                               f"{gpus} × {_exact(saved)} × {_exact(p)}", 2))

    def opt(name: str, d: decimal.Decimal | None) -> float | None:
        return None if d is None else _float(name, d)

    return CostResult(gpus=gpus, hours=float(hours), utilization=float(utilization),
                      price_per_gpu_hour=price_per_gpu_hour, target=target,
                      gpu_hours=_float("gpu_hours", gh), wasted_gpu_hours=_float("wasted_gpu_hours", wasted),
                      wasted_money=opt("wasted_money", money), hours_at_target=opt("hours_at_target", at),
                      hours_saved=opt("hours_saved", saved), gpu_hours_saved=opt("gpu_hours_saved", gh_saved),
                      money_saved=opt("money_saved", money_saved), lines=lines, notes=notes)


def lr_lines(lr: float, batch_old: int, batch_new: int) -> list[CalcLine]:
    """Both rules for a batch change: linear (SGD), square root (adaptive optimizers: Adam, LAMB)."""
    if not lr > 0:
        raise GpuidleError(f"learning rate {lr} must be above 0")
    out = []
    for rule, formula, note in (("linear", "lr × B_new / B_old", "SGD with momentum (Goyal et al., 2017)"),
                                ("sqrt", "lr × √(B_new / B_old)", "adaptive optimizers: Adam, AdamW, LAMB")):
        v = scaled_lr(lr, batch_old, batch_new, rule)
        worked = (f"{_num(lr)} × {batch_new} / {batch_old}" if rule == "linear"
                  else f"{_num(lr)} × √({batch_new} / {batch_old})")
        out.append(CalcLine(f"lr_{rule}", v, "", f"{formula} — {note}", f"{worked} = {_num(v)}",
                            "shown to 4 significant digits", f"{v:.4g}"))
    return out


def accumulation_line(target_batch: int, micro_batch: int, world_size: int = 1) -> CalcLine:
    """Accumulation steps, rounded up; the effective batch that results is stated, since it can exceed the target."""
    steps = accumulation_steps(target_batch, micro_batch, world_size)
    effective = steps * micro_batch * world_size
    return CalcLine("accumulation_steps", float(steps), "steps", "⌈target batch / (micro-batch × world size)⌉",
                    f"⌈{target_batch} / ({micro_batch} × {world_size})⌉ = {steps}",
                    f"rounded up to a whole step: effective batch {effective}", str(steps))


def busbw_line(collective: str, n: int, algbw_gbps: float) -> CalcLine:
    """busbw from algbw with nccl-tests' factor for ``collective`` over ``n`` ranks."""
    from gpuidle.analysis.comm import bus_factor

    if n < 1 or algbw_gbps < 0:
        raise GpuidleError("ranks must be at least 1 and algbw not negative")
    factor = bus_factor(collective, n)
    formulas = {"all_reduce": "algbw × 2(n − 1)/n", "all_gather": "algbw × (n − 1)/n",
                "reduce_scatter": "algbw × (n − 1)/n", "all_to_all": "algbw × (n − 1)/n",
                "broadcast": "algbw × 1", "reduce": "algbw × 1"}
    if collective not in formulas:
        raise GpuidleError(f"unknown collective {collective!r}", f"choose one of {', '.join(formulas)}")
    v = busbw(algbw_gbps, factor)
    return CalcLine(f"busbw_{collective}", v, "GB/s", formulas[collective],
                    f"{_num(algbw_gbps)} × {_num(factor)} (n = {n}) = {_num(v)}", "shown to 0.01", f"{v:,.2f} GB/s")


def cost_from_report(report: AnalysisReport, price_per_gpu_hour: float | None = None, hours: float = 1.0,
                     target: float | None = TARGET_UTILIZATION, gpus: int | None = None) -> CostResult:
    """The cost of a traced job per ``hours`` of training.

    Utilization is the mean over ranks of each rank's training device; GPUs are those with work in the
    analysed window (:func:`gpuidle.analysis.figures.gpus`), as every command counts them.
    """
    if not report.ranks:
        raise GpuidleError("the report has no ranks")
    u = figures.utilization(report)
    if u is None:
        raise GpuidleError(f"the run's utilization was not measured ({', '.join(figures.unmeasured(report))} counts "
                           "as busy): no cost can be taken from it",
                           "price it with --gpus, --hours and --utilization instead of --from")
    n = gpus or figures.gpus(report)
    result = cost(n, hours, min(max(u, 0.0), 1.0), price_per_gpu_hour, target if target and u > 0 else None)
    world = figures.world_size(report)
    part = [f"the traces are {len(report.ranks)} of the job's {world} ranks: to price the whole job, "
            f"gpuidle cost --from REPORT --gpus N"] if not gpus and world > len(report.ranks) else []
    return msgspec.structs.replace(result, notes=[
        *result.notes, f"utilization {u:.1%}: mean over {_count(len(report.ranks), 'traced rank')}; "
                       f"{_count(n, 'GPU')}{'' if gpus else ' with work in the window'}", *part])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
