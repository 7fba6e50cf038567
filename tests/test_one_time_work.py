"""One-time work found by its kind wherever it falls: a cold program's allocator frees and an Nsight export's
compilation ranges are start-up, set apart once, never a per-step cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus import CORPUS, needs_corpus
from gpuidle.api import analyze
from nsysexport import Export


@pytest.mark.parametrize("name", ["compileFusion", "nvrtc: compile kernel", "XLA compilation", "jit recompile"])
def test_a_compile_range_in_nvtx_is_start_up(tmp_path: Path, name: str) -> None:
    """1.5 s of compilation under an NVTX range, the device idle under it: start-up, not host work off the
    serving thread nor unattributed idle."""
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=200)
    e.nvtx(name, 300, 1_500_000)
    for k in range(3):
        e.launch(at=1_500_400 + k * 300, call_dur=10, start=1_500_410 + k * 300, dur=250)
    (rank,) = analyze([e.write(tmp_path / "jit.sqlite")]).ranks
    assert [(c.kind, c.name) for c in rank.startup] == [("compile", name)]
    assert rank.startup[0].idle_s == pytest.approx(1.5, rel=0.01)
    assert sum(rank.primary().idle_by_cause_s.values()) < 0.01


def test_a_compiled_region_is_not_compilation(tmp_path: Path) -> None:
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=200)
    e.nvtx("Torch-Compiled Region: 0/0", 300, 1_500_000)
    e.launch(at=1_500_400, call_dur=10, start=1_500_410, dur=250)
    (rank,) = analyze([e.write(tmp_path / "region.sqlite")]).ranks
    assert rank.startup == []


@needs_corpus
def test_a_cold_forward_s_allocator_free_is_start_up() -> None:
    """A cold Switch forward's second cudaFree (10.8 ms, the caching allocator at first use) is start-up, and its
    20 is_nonzero syncs at model.py(143) are the only sync source, not the Python line open during the free."""
    (rank,) = analyze([CORPUS / "switch_moe_a100_syncs.json.gz"]).ranks
    frees = sorted((c.kind, round(c.dur_s * 1e3, 1)) for c in rank.startup if c.name == "cudaFree")
    assert frees == [("allocation", 10.8), ("context", 1.9)]
    assert [s.function for s in rank.sync_sources] == ["switch_transformers/model.py(143): forward"]


def test_an_nvtx_range_over_the_unexplained_idle_names_it(tmp_path: Path) -> None:
    """A CUDA program's idle under its own NVTX range and nothing else: the range names the phase the device waited
    on, said above the fixes."""
    e = Export()
    for start in (0, 1000, 2000):
        e.launch(at=start, call_dur=10, start=start + 10, dur=200)
        e.nvtx("halo exchange", start + 250, 700)
    report = analyze([e.write(tmp_path / "halo.sqlite")])
    (q,) = [q for q in report.quality if q.kind == "host_unrecorded"]
    assert "the range 'halo exchange'" in q.says
