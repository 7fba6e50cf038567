"""A fix's code pastes as it is printed, at any terminal width.

Every fix of every bundled trace with device activity, rendered by the terminal report at 60, 80 and 200
columns: the printed block is found by its first line and read back, line by line, with its indent taken off.
Each line must be the fix's own line, whole (a wrapped line ends early and its rest is a line of its own), and
a fix written in Python must compile as printed (``compile()``): a wrapped comment turns into a statement.
"""

from __future__ import annotations

import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.model import AnalysisReport, Recommendation
from gpuidle.report.common import RenderOptions, shown_recommendations
from gpuidle.report.terminal import TerminalRenderer
from test_reference import GPU_TRACES

EXAMPLES = DATA.parent.parent / "examples"
TRACES = sorted({*(DATA / n for n in GPU_TRACES), DATA / "jax08_conv_mi300x8__tw003.xplane.pb",
                 DATA / "cloverleaf_a100__perlmutter-cloverleaf-cuda.sqlite", *EXAMPLES.glob("*.json.gz")})
WIDTHS = (60, 80, 200)


def python(code: str) -> bool:
    try:
        compile(code, "fix", "exec")
    except SyntaxError:
        return False
    return True


def printed_block(lines: list[str], after: int, rec: Recommendation) -> tuple[str, int]:
    """The fix's lines as the report printed them after line ``after``, the block's indent taken off (found by its
    first line), and the line after the block."""
    want = rec.fix.splitlines()
    starts = [i for i, line in enumerate(lines) if i >= after and line.strip() == want[0].strip()
              and line.endswith(want[0])]
    assert starts, f"{rec.id}: its code's first line is not printed whole: {want[0]!r}"
    first = lines[starts[0]]
    indent = len(first) - len(want[0])
    assert first[:indent].strip() == "", first
    block = lines[starts[0]:starts[0] + len(want)]
    assert all(line[:indent].strip() == "" for line in block if line), block
    return "\n".join(line[indent:] for line in block), starts[0] + len(want)


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name.split("__")[0])
def report(request: pytest.FixtureRequest) -> AnalysisReport:
    return api.analyze([request.param])


@pytest.mark.parametrize("width", WIDTHS)
def test_every_fix_pastes_as_printed(report: AnalysisReport, width: int) -> None:
    recs = shown_recommendations(report.recommendations, len(report.recommendations))
    text = TerminalRenderer().render(report, RenderOptions(top=len(recs), width=width))
    if not recs:  # a trace with nothing to fix says so
        assert "Nothing to fix" in text
        return
    lines, at = text.splitlines(), 0
    for rec in recs:  # in the order printed
        printed, at = printed_block(lines, at, rec)
        assert printed.splitlines() == [line.rstrip() for line in rec.fix.splitlines()], rec.id
        if python(rec.fix):
            compile(printed, rec.id, "exec")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_counter_logs_fixes_paste_too(width: int) -> None:
    """``summarize`` prints its fixes' code the same way."""
    from gpuidle.report.utilization import UtilTerminalRenderer

    summary = api.summarize_log(DATA / "smi" / "query_gpu_units.csv")
    recs = summary.recommendations
    lines = UtilTerminalRenderer().render(summary, RenderOptions(top=len(recs), width=width)).splitlines()
    assert recs
    at = 0
    for rec in recs:
        printed, at = printed_block(lines, at, rec)
        assert printed.splitlines() == [line.rstrip() for line in rec.fix.splitlines()], rec.id
