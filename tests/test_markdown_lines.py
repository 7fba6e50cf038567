"""The Markdown report says what the terminal says: its collectives, kernels and "nvidia-smi would count" lines
are read from the terminal's output and found, word for word, in the Markdown."""

from __future__ import annotations

import re

import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.report.common import RenderOptions
from gpuidle.report.markdown import MarkdownRenderer
from gpuidle.report.terminal import TerminalRenderer

TRACES = [DATA.parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz",
          DATA / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
          DATA / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.split("__")[0])
def test_markdown_has_the_terminals_facts(trace: object) -> None:
    report = api.analyze([trace])  # type: ignore[list-item]
    terminal = TerminalRenderer().render(report, RenderOptions(width=1000))
    markdown = MarkdownRenderer().render(report)
    facts = [line.strip() for line in terminal.splitlines() if line.startswith(("collectives:", "kernels:"))]
    facts += re.findall(r"\S+ would count [0-9.]+ %", terminal)
    assert any(f.startswith("kernels:") for f in facts)
    for fact in facts:
        assert fact in markdown, fact


def test_the_example_holds_the_lines_checked() -> None:
    """The DDP example has collectives and counts differently in nvidia-smi: the test above checks those lines."""
    report = api.analyze([TRACES[0]])
    terminal = TerminalRenderer().render(report, RenderOptions(width=1000))
    assert "collectives:" in terminal
    assert "would count" in terminal
