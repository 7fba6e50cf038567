"""The standard formulas behind every gain and cost gpuidle prints.

Each function states its formula; units are in the names (``_s`` seconds, ``_gbps``
gigabytes per second, ``_usd`` money in the user's currency).
"""

from __future__ import annotations

from gpuidle.errors import GpuidleError


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
