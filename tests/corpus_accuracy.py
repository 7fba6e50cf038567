"""Writes ``docs/accuracy.md``: for each trace of the shared corpus, the expert's first fix (from the corpus's
README) beside what gpuidle says first, its steps and its utilization. ``tests/test_corpus.py`` regenerates the page
and compares, so the page cannot drift from what the analysis prints.

    python tests/corpus_accuracy.py > docs/accuracy.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import CORPUS
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport

EXPERT = {
    "deepseek_dualpipe_h800_rank0.json.gz": "nothing to fix; DeepEP's dispatch/combine, 4.2 ms exposed",
    "dlrm_8rank_v100": "a larger per-GPU batch (compute is 6–9 % of the step)",
    "tf_bert_multigpu_v100": "each GPU's steps apart; the trace is a fragment: re-profile, said as what it lacks",
    "switch_moe_a100_cold.json.gz": "TF32 (or bf16) for the fp32 GEMMs; start-up apart",
    "switch_moe_a100_fp32.json.gz": "TF32 first, estimable from one forward",
    "switch_moe_a100_syncs.json.gz": "stop the syncs at model.py(143); the cudaFree as start-up",
    "vllm_v1_gb10_rank0.pt.trace.json.gz": "10 steps from the engine's iterations; nothing idle to fix",
    "resnet_2080ti.json.gz": "more DataLoader workers",
    "linear_2080ti.json.gz": "CUDA graphs / torch.compile(mode=\"reduce-overhead\")",
}
"""The expert's first fix for each corpus trace, in short, from ``../shared/corpus/README.md``."""

HEAD = """# Accuracy on traces from other projects

Nine public profiles from five projects, none written for gpuidle, each audited by hand (the corpus beside the
project, `../shared/corpus`, its README the expert's findings). For each: the steps gpuidle finds and where from,
the utilization of the rank it shows (the lowest of a job), what it says the trace cannot tell (above the fixes,
never a fix), the expert's first fix and gpuidle's. The page is written by `tests/corpus_accuracy.py`;
`tests/test_corpus.py` writes it again and compares, and checks each trace's figures against the README.

| trace | steps (source) | utilization | what the trace cannot tell | expert's first fix | gpuidle's first fix |
|---|---|---|---|---|---|
"""


def first_fix(report: AnalysisReport) -> str:
    """The first fix the terminal lists (or that there is none), with its gain."""
    recs = [r for r in report.recommendations if r.alternative_to is None]
    if not recs:
        return "nothing to fix"
    rec = recs[0]
    gain = rec.gain
    if gain.step_s_saved is None:
        return f"{rec.title} (no gain estimated)"
    low = gain.step_s_saved_low if gain.step_s_saved_low is not None else gain.step_s_saved
    high = gain.step_s_saved_high if gain.step_s_saved_high is not None else gain.step_s_saved
    saved = f"{low * 1e3:.1f} ms" if abs(high - low) < 5e-5 else f"{low * 1e3:.1f}–{high * 1e3:.1f} ms"
    return f"{rec.title} (saves {saved} a step)"


def row(name: str) -> str:
    report = analyze([CORPUS / name])
    shown = min(report.ranks, key=lambda r: r.primary().utilization)
    steps = f"{len(shown.steps)} ({shown.step_source})"
    quality = ", ".join(q.kind for q in report.quality) or "—"
    cells = [f"`{name}`", steps, f"{shown.primary().utilization:.1%}", quality, EXPERT[name], first_fix(report)]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"


def page() -> str:
    return HEAD + "".join(row(name) for name in EXPERT)


if __name__ == "__main__":
    sys.stdout.write(page())
