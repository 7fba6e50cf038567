"""What the tracker writes and says: the rank logs, rank 0's log lines, job view and summary.

``rank-<r>.jsonl`` per rank (schema ``gpuidle.tracker/1``: a header, one line per step, an
end line), and from rank 0 ``gpuidle-summary.json`` (the analysis report), its record in the
run ledger, a line every ``log_every`` steps and the job view at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from gpuidle.analysis.ranks import PERSISTENT_SCORE
from gpuidle.analysis.series import HOST_TIMED_NOTE, RankStats
from gpuidle.errors import GpuidleError
from gpuidle.model import TRACKER_SUMMARY, StepSeries

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport


class RankLog:
    """One rank's JSONL log, open until :meth:`close`; each write is flushed (a crash keeps what was written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - open until close()
        self._enc = msgspec.json.Encoder()

    def write(self, lines: Sequence[msgspec.Struct]) -> None:
        if lines:
            self._file.write(b"".join(self._enc.encode(x) + b"\n" for x in lines))
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def remove_stale(out_dir: Path, world: int) -> None:
    """Logs of ranks beyond this job's world, and an old summary, would mix two runs."""
    summary = out_dir / TRACKER_SUMMARY
    if summary.exists():
        summary.unlink()
    for f in out_dir.glob("rank-*.jsonl"):
        r = f.name[len("rank-"):-len(".jsonl")]
        if r.isdigit() and int(r) >= world:
            f.unlink()


def stderr(line: str) -> None:
    print(f"gpuidle: {line}", file=sys.stderr, flush=True)


DATA_NOT_MEASURED = "busy and data wait not measured (the data wait counts as busy)"
"""What the log says for a run that cannot time its data wait (``unmeasured`` holds ``data_loading``)."""


def log_line(step: int, stats: Sequence[RankStats], device_timed: bool, comm_timed: bool,
             unmeasured: Sequence[str] = ()) -> str:
    """``step 1200 | 212 ms | GPU busy 61 % | data wait 31 % (rank 3: 48 %) | straggler: rank 3 ×1.4``; where the
    data wait is not measured, that, not a busy share it cannot know."""
    step_ms = float(np.median([s.step_s for s in stats])) * 1e3
    busy = float(np.mean([s.busy_share for s in stats]))
    data = float(np.mean([s.data_share for s in stats]))
    known = "data_loading" not in unmeasured
    parts = [f"step {step}", f"{step_ms:.0f} ms", f"{'GPU' if device_timed else 'host'} busy {busy * 100:.0f} %",
             f"data wait {data * 100:.0f} %"] if known else [f"step {step}", f"{step_ms:.0f} ms", DATA_NOT_MEASURED]
    worst = max(stats, key=lambda s: s.data_share)
    if known and len(stats) > 1 and worst.data_share - data >= 0.05:
        parts[-1] += f" (rank {worst.rank}: {worst.data_share * 100:.0f} %)"
    if comm_timed:
        parts.append(f"comm {float(np.mean([s.comm_share for s in stats])) * 100:.0f} %")
    slow = max(stats, key=lambda s: s.score)
    if len(stats) > 1:
        parts.append(f"straggler: rank {slow.rank} ×{slow.score:.2f}" if slow.score >= PERSISTENT_SCORE
                     else "no straggler")
    return " | ".join(parts)


def job_view(report: AnalysisReport, stats: Sequence[RankStats], series: Sequence[StepSeries],
             out_dir: str) -> list[str]:
    """Rank 0's closing lines: the rank table, the straggler, the first fixes, and where the report is."""
    steps = max((s.steps for s in stats), default=0)
    timed = "phases timed on the device" if series and series[0].device_timed else "phases timed on the host"
    lines = [f"job view: {len(stats)} rank(s) · {steps} steps · {timed}",
             f"{'rank':>5} {'step':>10} {'busy':>6} {'data wait':>10} {'comm':>6} {'score':>6} "
             f"{'samples':>10} {'batches':>8}"]
    unknown = {r.rank for r in report.ranks if "data_loading" in r.unmeasured}
    for s in stats:
        busy, data = (f"{'n/m':>6}", f"{'n/m':>10}") if s.rank in unknown else \
            (f"{s.busy_share * 100:>4.0f} %", f"{s.data_share * 100:>8.0f} %")
        lines.append(f"{s.rank:>5} {s.step_s * 1e3:>7.2f} ms {busy} {data} "
                     f"{s.comm_share * 100:>4.0f} % {s.score:>6.2f} {s.samples:>10,} {s.batches:>8,}")
    if unknown:
        lines.append(f"n/m: {DATA_NOT_MEASURED}")
    if report.job is not None:
        for st in report.job.stragglers:
            lines.append(f"straggler: rank {st.rank} ×{st.score:.2f} — {st.why}")
        lines.extend(f"note: {n}" for n in report.job.notes if n != HOST_TIMED_NOTE)
    for rec in [r for r in report.recommendations if r.alternative_to is None and not r.gain.minor][:3]:
        g = rec.gain
        saved = None if g.step_s_saved is None else (
            f"{g.step_s_saved_low * 1e3:.2f}–{g.step_s_saved_high * 1e3:.2f} ms/step, modelled"
            if g.basis == "modelled" and g.step_s_saved_low is not None and g.step_s_saved_high is not None
            else f"{g.step_s_saved * 1e3:.2f} ms/step, measured")
        gain = "gain not estimable" if saved is None or g.utilization_after is None else (
            f"saves {saved} → utilization {g.utilization_after * 100:.0f} %")
        lines.append(f"fix: {rec.title} — {gain} [{rec.cause}]")
    if not report.recommendations:
        lines.append("no idle cause above its threshold")
    lines.append(f"full report: gpuidle analyze {out_dir}")
    return lines


def summarize(series: list[StepSeries], out_dir: Path, log: Callable[[str], None], label: str | None,
              ledger: Path | bool) -> AnalysisReport:
    """The job summary from every rank's series: written beside the logs, logged as the job view, and
    recorded in the run ledger (``ledger``: True for the default one, a path, or False for none)."""
    from gpuidle.advice.series_report import series_report
    from gpuidle.analysis.series import rank_stats

    report = series_report(series, [str(out_dir)])
    text = write_summary(report, out_dir)
    for line in job_view(report, rank_stats(series), series, str(out_dir)):
        log(line)
    if ledger is not False:
        record(report, text, out_dir, label, None if ledger is True else ledger, log)
    return report


def write_summary(report: AnalysisReport, out_dir: Path) -> str:
    """Write the job summary beside the rank logs; return its text."""
    text = msgspec.json.format(msgspec.json.encode(report).decode(), indent=2) + "\n"
    (out_dir / TRACKER_SUMMARY).write_text(text, encoding="utf-8")
    return text


def record(report: AnalysisReport, text: str, out_dir: Path, label: str | None, ledger_path: Path | None,
           log: Callable[[str], None]) -> None:
    """Keep the job summary in the run ledger with the figures ``analyze`` records (a problem is one log line)."""
    from gpuidle import ledger

    try:
        ledger.record("tracker", text, label=label, inputs=[out_dir / TRACKER_SUMMARY], path=ledger_path,
                      **ledger.analysis_facts(report))
    except GpuidleError as err:
        log(f"the job summary was not recorded in the ledger: {err}")
