"""The fleet table: many jobs analysed in one submit, one row each, and the fleet's totals by cause."""

from __future__ import annotations

import msgspec

from .jsonio import JsonStruct

FLEET_SCHEMA = "gpuidle.fleet/1"


class FleetJob(msgspec.Struct, kw_only=True):
    """One job of the fleet: its figures, or the one line saying why it has none."""

    name: str
    path: str
    gpus: int = 0
    """The GPUs with work in the analysed window over the job's traced ranks (``analysis.figures.gpus``), as for
    the cost of one job."""
    utilization: float | None = None
    """Mean over the traced ranks of each rank's training-device utilization."""
    idle_gpu_hours_by_cause: dict[str, float] = {}
    """Per ``hours`` of training: GPUs × hours × the mean share of the window idle for that cause."""
    idle_gpu_hours: float = 0.0
    top_fix: str | None = None
    skipped: list[str] = []
    """Files of the job that could not be analysed, each with its one-line reason."""
    error: str | None = None
    report: str | None = None
    """Where the job's own report was written (``--out-dir``)."""
    run_id: int | None = None
    """The job's run in the ledger."""


class FleetReport(JsonStruct, kw_only=True):
    schema: str = FLEET_SCHEMA
    paths: list[str]
    hours: float
    """Training hours the GPU-hours are given for (1: per hour)."""
    jobs: list[FleetJob]
    gpus: int
    idle_gpu_hours_by_cause: dict[str, float]
    idle_gpu_hours: float
    price_per_gpu_hour: float | None = None
    cost_by_cause: dict[str, float] | None = None
    cost: float | None = None
    failed_jobs: int = 0
    """Jobs without a report (none of their files readable)."""
