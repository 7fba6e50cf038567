"""What a trace can and cannot tell: statements printed above the fixes, never fixes themselves."""

from __future__ import annotations

import msgspec


class TraceQuality(msgspec.Struct, kw_only=True):
    """One thing the trace cannot show (a single step, a fragment of the work, lost device records, ...), with the
    one change to the recording that would show it. A statement about the evidence: it saves no time and never
    stands in the list of fixes."""

    kind: str
    """``one_step``, ``fragment``, ``gpus_without_kernels``, ``capture_only``, ``device_records_lost``,
    ``host_ahead``, ``profile_tail``, ``host_unrecorded``."""
    says: str
    """What the trace lacks, in numbers: "1 step: ...", "no GEMM and no collective in a 2-GPU step"."""
    recording: str | None = None
    """The one recording change that would help; None where none would (the host running ahead is the program's
    own pace, not the profiler's)."""
    ranks: list[int] = []
    """The ranks it holds for; empty in a rank's own list."""


QUALITY_KINDS = ("one_step", "fragment", "gpus_without_kernels", "capture_only", "device_records_lost",
                 "host_ahead", "profile_tail", "host_unrecorded")
"""Every kind of :class:`TraceQuality`, in the order a report lists them."""
