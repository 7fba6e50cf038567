"""What the advice says: each fix with its gain, the fixes not offered, their combined effect, and the cost
formulas' results: typed, serialised as-is inside the analysis and cost reports."""

from __future__ import annotations

from typing import Any

import msgspec


class Gain(msgspec.Struct, kw_only=True):
    """What a fix is worth in steady-state step time, from the one what-if model (``advice.whatif``)."""

    step_s_saved: float | None
    """Step time saved by this fix alone; None: not estimable (``reason`` says why)."""
    utilization_after: float | None
    utilization_before: float | None = None
    step_s_before: float | None = None
    step_s_after: float | None = None
    speedup: float | None = None
    """``step_s_before / step_s_after``: the throughput factor (samples/s) at the same batch."""
    reason: str | None = None
    """Why the gain is None, or why utilization falls although the step gets shorter."""
    after: str | None = None
    """The fix that must come first for this one to pay (it is hidden behind that rank's time)."""
    step_s_saved_after: float | None = None
    """Step time saved once the fixes ranked above it are applied."""
    minor: bool = False
    """Saves under 0.5 % of a step: kept in the JSON, left out of the terminal's top list."""
    step_s_saved_low: float | None = None
    step_s_saved_high: float | None = None
    """The range of ``step_s_saved``: equal to it for a measured saving, the assumption's bounds for a modelled one."""
    basis: str = "measured"
    """``measured``: the fix removes idle or excess measured in the input (a point); ``modelled``: its saving
    rests on ``assumption`` (a range)."""
    assumption: str | None = None
    scope: str = "job"
    """``job``: the job's step time (every rank, the slowest sets the pace); ``rank``: this rank's own step,
    where a job-level figure cannot be given (the report's job notes say why)."""


class Recommendation(msgspec.Struct):
    id: str
    cause: str
    title: str
    evidence: dict[str, Any]
    fix: str
    gain: Gain
    confidence: str
    """``high``: measured idle of this cause; ``medium``/``low``: an estimate."""
    rank: int | None = None
    alternative_to: str | None = None
    """Id of the fix that claims the same idle; this one is another way to recover it, not an addition."""


class Declined(msgspec.Struct):
    """A fix a rule measured but did not offer: one of its preconditions does not hold on this trace."""

    id: str
    rank: int
    check: str
    """The precondition that failed, in words."""


class Combined(msgspec.Struct):
    """Every fix that is not an alternative, applied together, on the same what-if model."""

    step_s_before: float
    step_s_saved: float
    step_s_after: float
    utilization_after: float
    fixes: list[str]
    limit: str
    """What sets the step time afterwards, in words."""
    step_s_saved_low: float | None = None
    step_s_saved_high: float | None = None
    """The range of ``step_s_saved`` when some of the fixes are modelled."""


class CalcLine(msgspec.Struct):
    """One result with its formula, the formula with the numbers in, and how it was rounded for display."""

    name: str
    value: float
    """Exact; only ``shown`` is rounded."""
    unit: str
    formula: str
    worked: str
    rounding: str
    shown: str


class CostResult(msgspec.Struct, kw_only=True):
    """What idle GPUs cost, and what a target utilization would save. Savings are never negative.

    Built by ``advice.calc.cost``; ``lines`` show each formula with its numbers and rounding.
    """

    gpus: int
    hours: float
    utilization: float
    price_per_gpu_hour: float | None
    target: float | None
    gpu_hours: float
    wasted_gpu_hours: float
    wasted_money: float | None = None
    """In the currency of ``price_per_gpu_hour`` (``wasted_usd`` before schema gpuidle.cost/2)."""
    hours_at_target: float | None
    hours_saved: float | None
    gpu_hours_saved: float | None
    money_saved: float | None = None
    """In the currency of ``price_per_gpu_hour`` (``usd_saved`` before schema gpuidle.cost/2)."""
    lines: list[CalcLine]
    notes: list[str] = []
