"""Markdown, for pasting a report into a pull request or an issue."""

from __future__ import annotations

from gpuidle.model import CAUSES, AnalysisReport, HostSide, RankReport, ranges
from gpuidle.report import host_side
from gpuidle.report.common import (
    CAUSE_MEANING,
    DEFAULT_OPTIONS,
    OWN_STEP,
    QUALITY_HEAD,
    TARGET_UTILIZATION,
    RenderOptions,
    collectives_words,
    combined_saved,
    excluded_lines,
    gain_text,
    kernel_words,
    mesh_lines,
    ms,
    pct,
    printable_report,
    quality_lines,
    role_lines,
    run_words,
    shown_recommendations,
    smi_words,
    source_label,
    startup_lines,
    step_rows,
    together,
    unmeasured_words,
    utilization_words,
    window_words,
)
from gpuidle.report.scaleout import scale_out_lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _host_side(lost: list[HostSide]) -> list[str]:
    """The first rank reported from its host side alone (the others named): its window, what its launching threads
    were inside, its steps and operators."""
    h = lost[0]
    out = [f"### {host_side.head(h)}", "", f"Window: {host_side.window_words(h, ', ')}; {host_side.NO_DEVICE}.", "",
           f"{host_side.ACTIVITY_HEAD[0].upper()}{host_side.ACTIVITY_HEAD[1:]}:", ""]
    out += [*_table(["", "time", "of window"], [list(r) for r in host_side.activity_rows(h)]), ""]
    if h.steps:
        out += [*_table(host_side.step_header(h), host_side.step_rows(h)), ""]
    if h.top_calls:
        out += [*_table(["operator", "calls", "time", "of window"], [list(r) for r in host_side.call_rows(h)]), ""]
    out += [f"> {n}" for n in h.notes] + ([""] if h.notes else [])
    if len(lost) > 1:
        out += [f"Ranks {ranges([x.rank for x in lost[1:]])}: host side only as well (the JSON report holds each).",
                ""]
    return out


class MarkdownRenderer:
    name = "md"
    extensions: tuple[str, ...] = (".md",)

    def render(self, report: AnalysisReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        report = printable_report(report)
        if not report.ranks:  # every rank's device records lost: the host's side alone
            lines = [f"## gpuidle: {source_label(report.source)}", "", *_host_side(report.host_side)]
        else:
            lines = [f"## gpuidle: {len(report.ranks)} rank(s), {source_label(report.source)}", "",
                     f"Run: {run_words(report, ', ')}.", ""]
        shown = report.ranks[:1] if report.job is None else [min(report.ranks, key=lambda r: r.primary().utilization)]
        if report.job is not None:
            job = report.job
            skew = "n/a" if job.step_skew is None else f"{job.step_skew:.3f}"
            lines += [f"**Job**: {len(job.ranks_found)} ranks, step-time skew {skew}", ""]
            lines += _table(["rank", "step", "own step", "utilization", "top cause"],
                            [[str(r.rank), ms(r.step_s), ms(r.own_step_s), pct(r.utilization), r.top_cause]
                             for r in job.rank_table])
            lines += ["", f"_{OWN_STEP}._", ""]
            for s in job.stragglers:
                lines.append(f"- **straggler** rank {s.rank}: late by {ms(s.lateness_s)} in steps {s.steps}, "
                             f"score {s.score:.2f}; {s.why}")
            c = job.communication
            lines += [f"- communication exposed {ms(c.exposed_s)}, straggler wait {ms(c.straggler_wait_s)}"]
            lines += [f"- {line.strip()}" for line in role_lines(c.parallelism, c.roles)
                      + mesh_lines(c.mesh, job.world_size, coordinates=False)] + [""]
        for r in shown:
            lines += self._rank(r)
            lines += [f"- {x}" for x in excluded_lines(r, report.include_warmup)]
            lines += [f"- {x.strip()}" for x in startup_lines(r)]
        lost = host_side.lost_ranks_line(report.host_side) if report.ranks else None
        lines += [f"> {lost}", ""] if lost is not None else []
        if report.cost is not None:
            lines += ["### Cost", ""]
            lines += _table(["", "value", "formula"],
                            [[x.name.replace("_", " "), x.shown, f"`{x.worked}`"] for x in report.cost.lines])
            lines += [f"> {n}" for n in report.cost.notes] + [""]
        if report.scale_out is not None:
            lines += [f"### At {report.scale_out.gpus} GPUs", ""]
            lines += [f"- {x}" for x in scale_out_lines(report.scale_out)] + [""]
        quality = quality_lines(report)
        if quality:
            lines += [f"### {QUALITY_HEAD}", ""]
            lines += [f"- {says}" + (f" ({recording})" if recording else "") for says, recording in quality] + [""]
        lines += ["### Top fixes", ""] if report.recommendations else []
        i = 0
        listed = shown_recommendations(report.recommendations, options.top)
        for rec in listed:
            if rec.alternative_to is None:
                i += 1
                lines.append(f"{i}. **{rec.title}** — {gain_text(rec)} ({rec.confidence} confidence)")
            else:
                lines.append(f"   - or: **{rec.title}** — {gain_text(rec)}")
            lines.append("   - evidence: " + ", ".join(f"`{k}={v}`" for k, v in rec.evidence.items()))
            lines += ["", "   ```python"] + [f"   {x}" for x in rec.fix.splitlines()] + ["   ```", ""]
        both = report.combined
        if both is not None and both.fixes:
            words = together(both, {r.id for r in listed})
            lines += [f"{words[0].upper()}{words[1:]}: {ms(both.step_s_before)} → {ms(both.step_s_after)}"
                      f"/step (saves {combined_saved(both)}), utilization {pct(both.utilization_after)}; "
                      f"then {both.limit}.", ""]
        if not report.recommendations:
            lines.append("Nothing to fix: no idle cause above its threshold." if report.ranks else host_side.NO_FIXES)
        return "\n".join(lines) + "\n"

    def _rank(self, r: RankReport) -> list[str]:
        d = r.primary()
        measured = r.unmeasured == [] or utilization_words(r, d) != "not measured"
        mark = "✅" if measured and d.utilization >= TARGET_UTILIZATION else "⚠️"
        out = [f"### Rank {r.rank}, device {d.device}: utilization {utilization_words(r, d)} {mark}", "",
               *([f"**{unmeasured}**", ""] if (unmeasured := unmeasured_words(r)) else []),
               f"Window: {window_words(r, ', ')}; idle {ms(d.idle_s)}"
               + (f"; {smi}." if (smi := smi_words(d)) else "."), ""]
        shown = [c.value for c in CAUSES if d.idle_by_cause_s[c.value] > 0]
        out += _table([f"idle cause, device {d.device}" if len(r.devices) > 1 else "idle cause", "time", "of window"],
                      [[f"{c}[^{c}-{r.rank}]", ms(d.idle_by_cause_s[c]), pct(d.idle_by_cause_s[c] / d.window_s)]
                       for c in shown])
        out += [""] + [f"[^{c}-{r.rank}]: {CAUSE_MEANING[c]}." for c in shown] + [""]
        if len(r.steps) > 1:
            out += _table(["step", "duration", "busy", "idle", "top cause"], [list(x) for x in step_rows(r)])
            out.append("")
        c = r.communication
        roles = role_lines(c.parallelism, c.roles) + mesh_lines(c.mesh, r.world_size)
        facts = [x for x in (collectives_words(r), *roles, kernel_words(r.kernels)) if x is not None]
        out += [f"- {line.strip()}" for line in facts] + ([""] if facts else [])
        out += [f"> {n}" for n in r.notes]
        return out + ([""] if r.notes else [])
