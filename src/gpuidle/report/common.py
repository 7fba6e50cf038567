"""Formatting shared by the renderers: units, shares, step summaries. No new numbers."""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from gpuidle.advice.hardware import hardware
from gpuidle.advice.whatif import UTILIZATION_TOLERANCE
from gpuidle.analysis import figures
from gpuidle.model import (
    DIMENSION_WORDS,
    SHAPE,
    AnalysisReport,
    Combined,
    CommRole,
    DeviceReport,
    Gain,
    KernelFacts,
    MeshDim,
    RankReport,
    Recommendation,
    Source,
    StartupCost,
    StepReport,
    duration,
    ranges,
)
from gpuidle.report.text import all_printable, printable

T = TypeVar("T")

TARGET_UTILIZATION = 0.9
MANY_STEPS = 12
"""Above this many steps, the step table shows the slowest ones and a summary."""


@dataclass(frozen=True, slots=True)
class RenderOptions:
    top: int = 3
    """How many recommendations to show."""
    color: bool = False
    width: int = 110


CAUSE_MEANING = {
    "data_loading": "waiting for the next batch (inside the data loader's __next__)",
    "host_sync": "the host waited on the GPU (.item(), .cpu(), a synchronize)",
    "launch_overhead": "the host launching work: framework dispatch, launch calls",
    "cpu_compute": "host code that launches nothing (Python, pre/post-processing)",
    "memcpy": "inside a blocking host-to-device copy call",
    "communication": "a collective ran or waited, with no compute beside it",
    "straggler_wait": "a collective waited for the last rank to arrive",
    "unattributed": "no host event explains the gap: record CPU activity",
}
"""Each idle cause in one line, where a report first shows it; docs/numbers.md holds the same table."""

STEP_SOURCE_WORDS = {
    "profiler_step": "steps from the profiler's step markers",
    "device_steps": "steps from the profile's Steps line",
    "engine_iterations": "steps from the engine's iterations",
    "named_ranges": "steps from ranges named like steps",
    "repeating_device_ranges": "steps from a range on the GPU's own timeline that repeats over the device's work",
    "repeating_ranges": "steps from a range that repeats with the device's work under it",
    "device_period": "steps from the device's own work, which repeats: no step markers in this profile",
    "tracker": "steps from the tracker",
    "inferred:dataloader_next": "steps inferred from DataLoader calls: no step markers in this profile",
    "inferred:optimizer_step": "steps inferred from optimizer steps: no step markers in this profile",
    "inferred:xla_program": "steps inferred from the compiled program's calls: no step markers in this profile",
    "inferred:nvtx_step_ranges": "steps from ranges named like steps",
    "none": "no step markers: the window is first to last GPU activity",
    "set_aside": "the trace's steps lie outside the device's work: the window is first to last GPU activity",
}
"""Where a rank's steps came from (``RankReport.step_source``), in the order they are taken; docs/numbers.md
holds the same table."""

FRAMEWORK_NAMES = {"pytorch": "PyTorch", "cuda": "CUDA application", "keras": "Keras on JAX"}


def source_label(source: Source) -> str:
    """The input's format, and the program's framework where the input tells (``nsys · CUDA application``)."""
    if not source.framework:
        return source.format
    return f"{source.format} · {FRAMEWORK_NAMES.get(source.framework, source.framework)}"


ms = duration
"""The one duration formatter (``1.52 ms``, ``812.4 µs``), shared with the probes' own reasons."""


def pct(share: float, digits: int = 1) -> str:
    return f"{share * 100:.{digits}f} %"


QUALITY_HEAD = "What this trace can tell"


def quality_lines(report: AnalysisReport) -> list[tuple[str, str | None]]:
    """Each statement of what the trace cannot tell, with the recording change that would show it (or None)."""
    several = len(report.ranks) + len(report.host_side) > 1
    out = []
    for q in report.quality:
        who = f" (rank{'s' if len(q.ranks) > 1 else ''} {ranges(q.ranks)})" if several and q.ranks else ""
        out.append((f"{q.says}{who}", f"to see it: {q.recording}" if q.recording else None))
    return out


def step_rows(r: RankReport) -> list[tuple[str, str, str, str, str]]:
    """Rows ``(step, duration, busy %, idle, top cause)``; the slowest steps when there are many."""
    steps = r.steps
    shown = steps if len(steps) <= MANY_STEPS else sorted(steps, key=lambda s: -s.dur_s)[:5]
    rows = []
    for s in shown:
        top = max(s.idle_by_cause_s.items(), key=lambda kv: kv[1])
        rows.append((str(s.step), ms(s.dur_s), pct(s.busy_s / s.dur_s if s.dur_s else 0.0), ms(s.idle_s),
                     top[0] if top[1] > 0 else "-"))
    if len(steps) > MANY_STEPS:
        durs = sorted(s.dur_s for s in steps)
        rows.append((f"({len(steps) - 5} more)", f"median {ms(durs[len(durs) // 2])}", "", "", ""))
    return rows


DEFAULT_OPTIONS = RenderOptions()


def utilization_falls(g: Gain) -> bool:
    """A fix that shortens the step but leaves the idle: utilization after is lower, not a gain."""
    return g.utilization_after is not None and g.utilization_before is not None \
        and g.utilization_after < g.utilization_before - UTILIZATION_TOLERANCE


def ms_range(low: float, high: float) -> str:
    """``18.0–41.0 ms``: one unit when both ends share it, a point when they are equal."""
    a, b = ms(low), ms(high)
    if a == b:
        return a
    (va, ua), (vb, ub) = a.rsplit(" ", 1), b.rsplit(" ", 1)
    return f"{va}–{vb} {ua}" if ua == ub else f"{a} – {b}"


def saved_text(g: Gain) -> str:
    """``35.50 ms, measured`` or ``18.0–41.0 ms, modelled``: a point where measured, a range where assumed."""
    if g.step_s_saved is None:
        return "not estimable"
    if g.basis == "modelled" and g.step_s_saved_low is not None and g.step_s_saved_high is not None:
        return f"{ms_range(g.step_s_saved_low, g.step_s_saved_high)}/step, modelled"
    return f"{ms(g.step_s_saved)}/step, measured"


def gain_text(rec: Recommendation) -> str:
    """The gain in words: step time first, utilization after with its reason when it falls."""
    g = rec.gain
    if g.step_s_saved is None:
        return f"gain not estimable: {g.reason}" if g.reason else "gain not estimable"
    assumed = f"; assumes {g.assumption}" if g.basis == "modelled" and g.assumption else ""
    if rec.alternative_to is not None:
        return f"alternative to {rec.alternative_to}: the same idle, saves {saved_text(g)} on its own{assumed}"
    if g.after is not None and g.step_s_saved_after is not None:
        return (f"saves {ms(g.step_s_saved)}/step now; {g.reason}: saves {ms(g.step_s_saved_after)}/step "
                f"after it{assumed}")
    text = f"saves {saved_text(g)}"
    if g.step_s_before is not None and g.step_s_after is not None:
        mid = " at the middle" if g.basis == "modelled" else ""
        text += f" ({ms(g.step_s_before)} → {ms(g.step_s_after)}/step{mid}"
        text += f", ×{g.speedup:.2f} samples/s)" if g.speedup is not None else ")"
    if g.utilization_after is not None:
        text += f" → utilization {pct(g.utilization_after)}"
        if utilization_falls(g) and g.reason:
            text += f" ({g.reason})"
    if g.scope == "rank" and g.reason and not utilization_falls(g):
        text += f"; {g.reason}"
    return text + assumed


def together(c: Combined, listed: Collection[str]) -> str:
    """``all 3 fixes above together``, ``the fix above``, or where the report lists only some of them (``listed``:
    the ids it shows), how many and where the rest are: a count never says more than the report shows."""
    n, shown = len(c.fixes), sum(f in listed for f in c.fixes)
    head = "the one fix" if n == 1 else f"all {n} fixes together"
    if shown == n:
        return "the fix above" if n == 1 else f"all {n} fixes above together"
    where = "not listed above" if shown == 0 else f"{shown} of them listed above"
    return f"{head} ({where}; every fix: --top N or --format json)"


def combined_saved(c: Combined) -> str:
    """The combined saving, a range when some of its fixes are modelled."""
    low = c.step_s_saved if c.step_s_saved_low is None else c.step_s_saved_low
    high = c.step_s_saved if c.step_s_saved_high is None else c.step_s_saved_high
    if low == high:
        return ms(c.step_s_saved)
    return f"{ms(c.step_s_saved)}, {ms_range(low, high)} with the modelled ranges"


def combined_text(c: Combined, listed: Collection[str]) -> str:
    """Every fix that is not an alternative, applied together: the plan's step time and what limits it then."""
    return (f"{together(c, listed)}: {ms(c.step_s_before)} → {ms(c.step_s_after)}/step "
            f"(saves {combined_saved(c)}), utilization {pct(c.utilization_after)}; then {c.limit}")


def shown_recommendations(recs: list[Recommendation], top: int) -> list[Recommendation]:
    """The top list: fixes that are not alternatives and not below 0.5 % of a step; alternatives follow theirs."""
    heads = [r for r in recs if r.alternative_to is None and not r.gain.minor][:top]
    ids = {r.id for r in heads}
    return [r for r in recs if r.id in ids or (r.alternative_to in ids)]


def excluded_lines(r: RankReport, kept: bool = False) -> list[str]:
    """``step 0, 4,489 ms: warm-up, left out`` for every step outside steady state."""
    words = {"warmup": "warm-up", "profiler": "profiler start/stop", "outlier": "outlier", "no_gpu_work": "no GPU work",
             "truncated": "cut short where the profile started or stopped"}
    how = "kept (--include-warmup)" if kept else "left out of per-step figures and gains"
    return [f"step {s.step}, {ms(s.dur_s)}: {words.get(s.excluded, s.excluded)}{_held_by(s)}, {how}"
            for s in r.steps if s.excluded is not None]


def _held_by(s: StepReport) -> str:
    """`` (host_sync 463.0 ms under one cudaMemcpyAsync call of 463.0 ms, its transfer 4.5 µs)``: the call under
    an outlier's largest cause, where one call holds it."""
    if s.excluded != "outlier" or not s.idle_by_cause_s:
        return ""
    cause = max(s.idle_by_cause_s, key=lambda c: s.idle_by_cause_s[c])
    call = s.main_calls.get(cause)
    return "" if call is None else f" ({cause} {ms(s.idle_by_cause_s[cause])} under {call.words()})"


STARTUP_SHOWN = 8
"""Start-up costs a text report lists one by one; the rest are counted (all of them are in the JSON)."""


def run_words(report: AnalysisReport, sep: str = " · ") -> str:
    """``8 GPUs · steady step 27.83 ms · idle 27.03 ms per steady step · utilization 2.9 %``: the run's figures as
    history, compare, cost and the fleet table show them (:mod:`gpuidle.analysis.figures`); where the steps left
    out move it, the utilization over the steady steps beside it, the one the fixes start from."""
    gpus, util = figures.gpus(report), figures.utilization(report)
    steady = pct(figures.steady_utilization(report))
    said = (f"utilization not measured ({', '.join(figures.unmeasured(report))} counts as busy)" if util is None
            else f"utilization {pct(util)}" + (f" ({steady} over the steady steps)" if steady != pct(util) else ""))
    return sep.join([f"{gpus} GPU{'' if gpus == 1 else 's'} with work", f"steady step {ms(figures.step_s(report))}",
                     f"idle {ms(figures.idle_s(report))} per steady step", said])


def window_words(r: RankReport, sep: str = " · ") -> str:
    """``1 step(s) · 640.0 ms analysed (12,920.2 ms less 12,280.2 ms of start-up) · steps from ...``: the rank's
    window, where start-up was set apart the time the figures are over (``DeviceReport.window_s``), and where its
    steps came from (:data:`STEP_SOURCE_WORDS`)."""
    w, d = r.window, r.primary()
    length = (f"{ms(d.window_s)} analysed ({ms(w.dur_s)} less {ms(d.startup_s)} of start-up)" if d.startup_s > 0
              else ms(w.dur_s))
    return sep.join([f"{len(r.steps)} step(s)", length, STEP_SOURCE_WORDS.get(r.step_source, r.step_source)])


def startup_head(r: RankReport) -> str | None:
    """``start-up cost (once, left out of per-step figures and gains): 12,280.2 ms of device idle``, or None
    without start-up costs: the device idle the analysis set apart under them (``DeviceReport.startup_s``)."""
    if not r.startup:
        return None
    return f"start-up cost (once, left out of per-step figures and gains): {ms(r.primary().startup_s)} of device idle"


def startup_item(c: StartupCost) -> str:
    """``6,008.7 ms cudaFree (context)``: one start-up call, its duration and kind, and the device idle it cost
    inside the window where that is not all of it (a call that began before the window, or overlapped work)."""
    kind = c.kind.replace("_", " ")
    if c.idle_s < 0.99 * c.dur_s:
        return f"{ms(c.dur_s)} {c.name} ({kind}; {ms(c.idle_s)} of device idle in the window)"
    return f"{ms(c.dur_s)} {c.name} ({kind})"


def startup_lines(r: RankReport) -> list[str]:
    """One-time start-up costs, once: the head line, then ``  6,008.7 ms cudaFree (context)`` per call."""
    head = startup_head(r)
    if head is None:
        return []
    more = len(r.startup) - STARTUP_SHOWN
    return [head] + [f"  {startup_item(c)}" for c in r.startup[:STARTUP_SHOWN]] + (
        [f"  +{more} more (--format json)"] if more > 0 else [])


def printable_report(report: T) -> T:
    """A copy of a report (msgspec structs, lists, dicts) with :func:`~gpuidle.report.text.printable` applied
    to every string, for the renderers of text: no name from an input reaches the terminal raw. Renderers only
    read it: where nothing needs cleaning, it is the report itself.

    Line breaks stay: fixes and notes are several lines by design. Each distinct string is cleaned once and numbers
    pass as they are: a profile of 100,000 steps repeats its few names in every step; a report whose JSON holds no
    escape and nothing unprintable (most) is returned as it is.
    """
    if _already_printable(report):
        return report
    seen: dict[str, str] = {}

    def clean(x: Any) -> Any:
        kind = type(x)
        if kind is float or kind is int or x is None or kind is bool:
            return x
        if kind is str:
            out = seen.get(x)
            if out is None:
                out = seen[x] = printable(x, keep_newlines=True)
            return out
        if isinstance(x, str):
            return printable(x, keep_newlines=True)
        if isinstance(x, msgspec.Struct):
            return msgspec.structs.replace(x, **{f: clean(getattr(x, f)) for f in x.__struct_fields__})
        if isinstance(x, list | tuple):
            return type(x)(clean(v) for v in x)
        if isinstance(x, dict):
            return {clean(k): clean(v) for k, v in x.items()}
        return x

    out: T = clean(report)
    return out


_JSON_ESCAPE = re.compile(rb"\\[ubfrt]")
"""How JSON writes a control character (a line break, ``\\n``, stays in a report's text); one search, in C."""


def _already_printable(report: object) -> bool:
    """Whether every string in ``report`` is printable already: one pass over its JSON, in C."""
    try:
        data = msgspec.json.encode(report)
    except (TypeError, ValueError, msgspec.EncodeError):  # lone surrogates, a type JSON does not hold
        return False
    if _JSON_ESCAPE.search(data):
        return False
    if data.isascii():
        return b"\x7f" not in data  # DEL: the one ASCII character JSON leaves raw and printable escapes
    return all_printable(data.decode(), keep_newlines=True)


ROLE_TEXT = {
    "param_all_gather_forward": "parameter all-gather before a module's forward (prefetch too late)",
    "param_all_gather_backward": "parameter all-gather in backward",
    "param_all_gather_optimizer": "parameter all-gather after the optimizer step",
    "grad_reduce_scatter": "gradient reduce-scatter (exposed at the end of backward)",
    "replicate_all_reduce": "all-reduce across replicas (HSDP)",
    "grad_all_reduce": "gradient all-reduce",
    "other": "other collectives",
}
STYLE_TEXT = {"ddp": "data parallel: DDP", "fsdp2": "data parallel: FSDP2 (fully_shard)",
              "deepspeed_zero3": "data parallel: DeepSpeed ZeRO-3",
              "deepspeed_zero1_2": "data parallel: DeepSpeed ZeRO-1/2", "deepspeed": "data parallel: DeepSpeed",
              "tensor_parallel": "tensor parallel (inference: the all-reduces sum activations across GPUs)",
              "unknown": "parallelism: not recognised"}


OWN_STEP = "own step: the step less the wait for other ranks (straggler_wait); each gain starts from it"


def exposed_words(exposed_s: float, communication_s: float, straggler_wait_s: float) -> str:
    """``336.0 ms exposed (no compute beside them) · idle charged to communication 256.1 ms, to straggler_wait
    80.86 ms``: the collectives' exposed time, which the role rows below add up to, and the idle causes it is
    charged to (a collective call the host waits in counts there too)."""
    return (f"{ms(exposed_s)} exposed (no compute beside them) · idle charged to communication "
            f"{ms(communication_s)}, to straggler_wait {ms(straggler_wait_s)}")


def smi_words(d: DeviceReport) -> str | None:
    """``nvidia-smi would count 64.1 %``: the device's share with collectives counted as work, where it differs."""
    smi = hardware(d).smi
    if d.active_s <= d.busy_s or smi is None or not d.window_s:
        return None
    return f"{smi} would count {pct(d.active_s / d.window_s)}"


def collectives_words(r: RankReport) -> str | None:
    """``collectives: 336.0 ms on the device, ... · overlap 41.2 %``, where the rank ran collectives."""
    c, d = r.communication, r.primary()
    if c.comm_s <= 0:
        return None
    overlap = "n/a" if c.overlap_ratio is None else pct(c.overlap_ratio)
    exposed = exposed_words(c.exposed_s, d.idle_by_cause_s.get("communication", 0.0),
                            d.idle_by_cause_s.get("straggler_wait", 0.0))
    return f"collectives: {ms(c.comm_s)} on the device, {exposed} · overlap {overlap}"


def kernel_words(k: KernelFacts) -> str | None:
    """``kernels: 235 (1.7 % of kernel time in kernels < 10 µs) · ... · syncs/step 1.0 · .item()/step 0.0``."""
    if k.count:
        facts = f"kernels: {k.count} ({pct(k.short_kernel_share)} of kernel time in kernels < 10 µs)"
        if k.reduced_precision_gemm_share is not None:
            facts += f" · GEMM/conv in fp16/bf16 or on matrix units: {pct(k.reduced_precision_gemm_share)}"
        return facts + f" · syncs/step {k.syncs_per_step:.1f} · .item()/step {k.item_calls_per_step:.1f}"
    if k.syncs_per_step:  # step timing: no kernels seen, only the loop's syncs where the tracker timed them
        return f"syncs/step {k.syncs_per_step:.1f}"
    return None


UNMEASURED_WORDS = {
    "data_loading": "data_loading not measured: its time counts as busy (see the first fix)",
    "host_activity": "host activity not recorded: the idle cannot be split by cause (see the first fix)",
}


def utilization_words(r: RankReport, d: DeviceReport) -> str:
    """``99.9 %``, or ``not measured`` where the rank's busy time holds a wait it could not time."""
    u = figures.device_utilization(r, d)
    return "not measured" if u is None else pct(u)


def unmeasured_words(r: RankReport) -> str | None:
    """``data_loading not measured: its time counts as busy``, or None where the run measured every cause."""
    if not r.unmeasured:
        return None
    return "; ".join(UNMEASURED_WORDS.get(u, f"{u} not measured") for u in r.unmeasured)


def mesh_lines(mesh: list[MeshDim], world: int | None, coordinates: bool = True) -> list[str]:
    """``mesh: 8 ranks: pp 2 × dp 2 × tp 2 · this rank pp 0, dp 1, tp 1 · tp inferred from ...``, then where the
    job has more than one dimension, one line per dimension: its communication idle, device time and count."""
    shaped = [m for m in mesh if m.dim in SHAPE]
    if not mesh:
        return []
    shape = " × ".join(f"{m.dim} {m.size if m.size is not None else '?'}" for m in shaped) or "no dimension named"
    head = f"mesh: {world} ranks: {shape}" if world else f"mesh: {shape}"
    placed = [f"{m.dim} {m.coordinate}" for m in shaped if m.coordinate is not None]
    if coordinates and placed:
        head += f" · this rank {', '.join(placed)}"
    told = sorted({m.source for m in shaped if not m.inferred})
    inferred = [f"{m.dim} {m.source}" for m in shaped if m.inferred]
    if told:
        head += f" · from {', '.join(told)}"
    if inferred:
        head += " · " + "; ".join(inferred)
    sizes = [m.size for m in shaped if m.dim != "ep"]
    if world and sizes and all(n is not None for n in sizes) and math.prod(n or 1 for n in sizes) != world:
        head += (f" · the dimensions' sizes multiply to {math.prod(n or 1 for n in sizes)}, not {world}: a dimension"
                 " is not recorded")
    lines = [head]
    if len(mesh) > 1:
        lines += [f"  {DIMENSION_WORDS.get(m.dim, m.dim)} ({m.dim}): {ms(m.exposed_s)} of communication idle, "
                  f"{ms(m.comm_s)} on the device, {m.count} collectives" for m in mesh]
    return lines


def role_lines(parallelism: str, roles: list[CommRole]) -> list[str]:
    """``data parallel: FSDP2`` and one line per role: exposed, device time, count."""
    lines = [STYLE_TEXT.get(parallelism, f"parallelism: {parallelism}")] if parallelism != "unknown" or roles else []
    lines += [f"{ROLE_TEXT.get(r.role, r.role)}: {ms(r.exposed_s)} exposed of {ms(r.comm_s)}, {r.count} collectives"
              for r in roles]
    return lines
