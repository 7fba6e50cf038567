"""The scale-out what-if in words: the lines every renderer prints under ``--scale-to N``."""

from __future__ import annotations

from gpuidle.model import ScaleOut, Span
from gpuidle.report.common import ms, pct


def _span(s: Span, fmt: str = "ms") -> str:
    if fmt == "pct":
        lo, hi = pct(s.low), pct(s.high)
        return f"{pct(s.now)} → {lo}" if lo == hi else f"{pct(s.now)} → {lo}–{hi}"
    lo, hi = ms(s.low), ms(s.high)
    return f"{ms(s.now)} → {lo}" if lo == hi else f"{ms(s.now)} → {lo}–{hi}"


def scale_out_lines(so: ScaleOut) -> list[str]:
    """The heading's figures, the answer, the fitted link and each assumption, one line each."""
    scaling = "the global batch kept" if so.scaling == "strong" else "the per-GPU batch kept"
    out = [f"{so.gpus_now} → {so.gpus} GPUs ({so.dim}, {scaling}): step {_span(so.step_s)} · utilization "
           f"{_span(so.utilization, 'pct')} · samples/s ×{so.throughput_x.low:.2f}–{so.throughput_x.high:.2f}"
           + (f" ({so.samples_per_s.now:,.0f} → {so.samples_per_s.low:,.0f}–{so.samples_per_s.high:,.0f})"
              if so.samples_per_s is not None else ""),
           so.answer]
    if so.comm is not None:
        bw = "no bandwidth term" if so.comm.busbw_gbps is None else f"bus bandwidth {so.comm.busbw_gbps:.3g} GB/s"
        out.append(f"communication model ({so.comm.source}): α {ms(so.comm.alpha_s)} per ring step, {bw}"
                   + (f", {so.comm.inter_node_gbps:.3g} GB/s across nodes" if so.comm.inter_node_gbps else ""))
    out += [f"assumes {a}" for a in so.assumptions]
    out += [f"missing: {m}" for m in so.missing]
    return out
