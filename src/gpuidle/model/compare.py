"""The comparison of two runs (``gpuidle compare``): each side's figures, what changed, what it is worth."""

from __future__ import annotations

import msgspec

from .jsonio import JsonStruct

COMPARE_SCHEMA = "gpuidle.compare/1"


class RunSummary(msgspec.Struct):
    """One side of a comparison: the figures that tell whether a change helped."""

    ref: str
    """How the run was named: ``run 12``, or a report path."""
    label: str | None
    gpu_model: str | None
    world_size: int
    """The job's ranks as the traces record them (a folder may hold a part of a job)."""
    batch_size: int | None
    ranks: int
    steps: int
    """Steady steps the per-step figures are the mean of, summed over ranks."""
    utilization: float | None
    """Busy / window over the primary device of every rank; None where not measured (``not_measured`` says what)."""
    step_s: float
    """The steady step: the slowest rank's mean over its steady steps, as ``analyze`` shows it."""
    idle_s: float
    """Idle per steady step."""
    idle_by_cause_s: dict[str, float]
    """Idle per steady step, by cause."""
    recommendations: list[str]
    """Recommendation ids, largest gain first."""
    gpus: int = 0
    """GPUs with work in the analysed window, over the traced ranks (``analysis.figures.gpus``)."""
    excluded_steps: list[str] = []
    """The steps left out of the per-step figures, by reason (``warmup: step 0``)."""
    not_measured: list[str] = []
    """What the run's busy time holds unmeasured (``data_loading``: a Keras fit without ``callback.dataset()``)."""


class RecommendationChange(msgspec.Struct):
    id: str
    cause: str
    title: str
    status: str
    """``resolved`` (before only), ``new`` (after only) or ``remaining`` (both)."""
    gain_before_s: float | None
    """Step time the fix would save, before; None when not recommended then."""
    gain_after_s: float | None


class CostDelta(msgspec.Struct):
    """What the step-time change is worth: ``step_s * steps * GPUs * price / 3600``, GPUs those with work."""

    price_per_gpu_hour: float
    steps: int
    """Steps priced: an epoch, a run, or 1000 by default."""
    before: float
    after: float
    saved: float
    """``before - after``; negative when the change made it dearer."""


class Comparison(JsonStruct, kw_only=True):
    schema: str = COMPARE_SCHEMA
    before: RunSummary
    after: RunSummary
    comparable: bool
    differences: list[str]
    """Why the runs are not comparable: GPU model, world size or batch differs."""
    notes: list[str]
    """Differences worth knowing that do not make the numbers meaningless."""
    utilization_delta: float | None
    """None where either run's utilization was not measured."""
    step_s_delta: float
    speedup: float | None
    """``before.step_s / after.step_s``."""
    idle_by_cause_delta_s: dict[str, float]
    """Per step, after minus before."""
    recommendations: list[RecommendationChange]
    cost: CostDelta | None = None


