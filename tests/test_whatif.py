"""The what-if model on hand-built traces: steady-state steps, shared idle, the job's critical path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.analysis.steps import after_profiling, steady_state
from gpuidle.api import analyze
from minitrace import Trace

US = 1e-6
NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
ELEMENTWISE = "void at::native::elementwise_kernel<128, 4>(int, float*)"


def test_steady_state_rules() -> None:
    # median 100, MAD 1 -> limit max(100 + 5 * 1.4826, 125) = 125
    assert steady_state([4489, 100, 101, 99, 100, 150]) == ["warmup", None, None, None, None, "outlier"]
    assert steady_state([300, 290, 100, 100, 100, 100]) == ["warmup", "warmup", None, None, None, None]
    assert steady_state([100, 124, 100]) == [None, None, None]  # under 25 % above the median: jitter
    assert steady_state([900, 100]) == [None, None]  # two steps cannot be judged
    assert steady_state([100, 100, 237, 100, 100], [False, False, True, False, False])[2] == "profiler"
    assert after_profiling([False, True, True, False, False]).tolist() == [False, True, True, True, False]


def warmup_then_loader(tmp_path: Path) -> Path:
    """Step 1: 20 ms of launch-bound warm-up; steps 2-6: 600 µs of data wait in 1000 µs."""
    t = Trace()
    t.step(1, 0, 20_000)
    for k in range(100):  # a 10 µs kernel every 200 µs, the launch call filling the gap
        t.launch(at=k * 200, call_dur=190, start=k * 200 + 190, dur=10)
    for n in range(5):
        base = 20_000 + n * 1000
        t.step(n + 2, base, 1000)
        t.annotation(NEXT, base, 600)
        t.launch(at=base + 600, call_dur=10, start=base + 620, dur=380)
    return t.write(tmp_path / "warmup.json.gz")


def test_warmup_step_is_left_out_of_gains(tmp_path: Path) -> None:
    path = warmup_then_loader(tmp_path)
    report = analyze([path])
    steps = report.ranks[0].steps
    assert [s.excluded for s in steps] == ["warmup", None, None, None, None, None]
    top = report.recommendations[0]
    assert top.id == "dataloader_workers"
    assert top.gain.step_s_saved == pytest.approx(600 * US)  # the steady step's wait, not the warm-up's
    assert top.gain.step_s_before == pytest.approx(1000 * US)
    assert top.gain.utilization_after == pytest.approx(380 / 400)
    assert not any(r.id == "cuda_graphs" for r in report.recommendations)  # the warm-up was launch-bound
    # whole-window figures keep every step
    d = report.ranks[0].primary()
    assert d.window_s == pytest.approx(25_000 * US)
    assert d.busy_s == pytest.approx((100 * 10 + 5 * 380) * US)


def test_include_warmup_keeps_it(tmp_path: Path) -> None:
    report = analyze([warmup_then_loader(tmp_path)], include_warmup=True)
    assert report.include_warmup
    loader = next(r for r in report.recommendations if r.id == "dataloader_workers")
    # mean over six steps: 5 * 600 µs of data wait, step (20000 + 5 * 1000) / 6
    assert loader.gain.step_s_saved == pytest.approx(5 * 600 / 6 * US)
    assert loader.gain.step_s_before == pytest.approx(25_000 / 6 * US)


def launch_bound(tmp_path: Path) -> Path:
    """Per 1000 µs step, 20 kernels of 5 µs, each 45 µs after its 40 µs launch call: launch-bound."""
    t = Trace()
    for n in range(5):
        base = n * 1000
        t.step(n + 1, base, 1000)
        for k in range(20):
            t.launch(at=base + k * 50, call_dur=40, start=base + k * 50 + 45, dur=5, name=ELEMENTWISE)
    return t.write(tmp_path / "launch.json.gz")


def test_two_fixes_of_one_idle_share_it(tmp_path: Path) -> None:
    report = analyze([launch_bound(tmp_path)])
    rank = report.ranks[0]
    idle_launch = rank.primary().idle_by_cause_s["launch_overhead"] / len(rank.steps)
    graphs = next(r for r in report.recommendations if r.id == "cuda_graphs")
    batch = next(r for r in report.recommendations if r.id == "larger_batch")
    assert graphs.alternative_to is None
    # modelled: graph replay removes half to all of the launch gaps; the nominal is the middle
    g = graphs.gain
    assert g.basis == "modelled"
    assert (g.step_s_saved_low, g.step_s_saved, g.step_s_saved_high) == pytest.approx(
        (idle_launch / 2, idle_launch * 3 / 4, idle_launch))
    assert g.assumption is not None
    assert "50–100 % of the launch gaps" in g.assumption
    # larger_batch claims 40-50 % of the same launch idle (the GPU computes a tenth of the step: compute-light, its
    # fixed costs halve per sample): an alternative, not an addition
    assert batch.alternative_to == "cuda_graphs"
    assert (batch.gain.step_s_saved_low, batch.gain.step_s_saved_high) == pytest.approx((idle_launch * 0.4,
                                                                                         idle_launch / 2))
    c = report.combined
    assert c is not None
    assert "larger_batch" not in c.fixes
    assert (c.step_s_saved_low, c.step_s_saved, c.step_s_saved_high) == pytest.approx(
        (idle_launch / 2, idle_launch * 3 / 4, idle_launch))
    assert c.step_s_after == pytest.approx(1000 * US - idle_launch * 3 / 4)
    # the alternative is listed right under the fix it is an alternative to
    ids = [r.id for r in report.recommendations]
    assert ids.index("larger_batch") == ids.index("cuda_graphs") + 1


def hidden_data_wait(tmp_path: Path, steps: int = 6) -> Path:
    """Rank 0 spends 1000 µs in a host op each step (the straggler); rank 1 waits 500 µs for data.

    Both all-reduce until 1800 µs: rank 0 from 1500 (pure transfer), rank 1 from 1000 (500 µs of it
    waiting for rank 0). Rank 1's data wait is hidden behind rank 0.
    """
    for rank in (0, 1):
        t = Trace(rank=rank, world=2)
        for s in range(steps):
            base = s * 2000
            t.step(s + 1, base, 2000)
            ready = base + 1000 if rank == 0 else base + 500
            if rank == 0:
                t.op("preprocess_batch", base, 1000)  # host work around the model: moved, all of it goes
            else:
                t.annotation(NEXT, base, 500)
            t.launch(at=ready, call_dur=10, start=ready + 10, dur=490, name=ELEMENTWISE)
            t.op("autograd::engine::evaluate_function: MmBackward0", ready + 100, 10)  # training, device busy
            t.op("record_param_comms", ready + 20, 20, **{
                "Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 262144,
                "Out msg nelems": 262144, "dtype": "Float", "Group size": 2})
            t.launch(at=ready + 25, call_dur=5, start=ready + 500, dur=base + 1800 - (ready + 500), stream=20,
                     name=ALLREDUCE)
        t.write(tmp_path / f"rank{rank}.json.gz")
    return tmp_path


def test_a_fix_behind_the_straggler_pays_only_after_it(tmp_path: Path) -> None:
    report = analyze([hidden_data_wait(tmp_path)], workers=2)
    assert report.job is not None
    (lag,) = report.job.stragglers
    assert lag.rank == 0
    assert lag.cause == "cpu_compute"
    recs = {r.id: r for r in report.recommendations}
    first = report.recommendations[0]
    # rank 0 sets the pace (own step 2000 µs, rank 1's 1500 µs): removing its 1000 µs of host work
    # leaves rank 1 as the limit, 500 µs saved
    assert (first.id, first.rank) == ("move_cpu_work", 0)
    assert first.gain.step_s_saved == pytest.approx(500 * US)
    straggler = recs["straggler_rank_0"]
    assert straggler.alternative_to == "move_cpu_work"  # the same idle of rank 0
    assert straggler.gain.step_s_saved == pytest.approx(500 * US)
    loader = recs["dataloader_workers"]
    assert loader.rank == 1
    assert loader.gain.step_s_saved == pytest.approx(0.0, abs=1e-12)  # hidden behind rank 0
    assert loader.gain.step_s_saved_after == pytest.approx(500 * US)
    assert loader.gain.after == "move_cpu_work"
    assert loader.gain.reason == "after move_cpu_work on rank 0, data_loading on rank 1 limits the step: 0.50 ms"
    ids = [r.id for r in report.recommendations if r.alternative_to is None]
    assert ids.index("dataloader_workers") == 1
    assert report.combined is not None
    c = report.combined
    assert c.step_s_before == pytest.approx(2000 * US)
    assert c.step_s_saved == pytest.approx(c.step_s_before - c.step_s_after)
    # never more than the idle the applied fixes remove
    claimed = 1000 + 500 + 150  # host op, data wait, half of rank 0's 300 µs exposed all-reduce
    assert c.step_s_saved <= claimed * US + 1e-12


DEVICES = {
    "v100": ({"id": 0, "name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0}, "float16"),
    "a100": ({"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0}, "bfloat16"),
    "h100": ({"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}, "bfloat16"),
    "mi300x": ({"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4}, "bfloat16"),
}


class DeviceTrace(Trace):
    def __init__(self, props: dict[str, object]) -> None:
        super().__init__()
        self.props = props

    def to_dict(self) -> dict[str, object]:
        doc = super().to_dict()
        doc["deviceProperties"] = [self.props]
        return doc


def fp32_gemms(tmp_path: Path, props: dict[str, object]) -> Path:
    t = DeviceTrace(props)
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.annotation(NEXT, base, 300)
        t.launch(at=base + 300, call_dur=10, start=base + 310, dur=600, name="volta_sgemm_128x64_nn")
    return t.write(tmp_path / "gemm.json.gz")


@pytest.mark.parametrize("gpu", sorted(DEVICES))
def test_mixed_precision_fits_the_device(gpu: str, tmp_path: Path) -> None:
    props, dtype = DEVICES[gpu]
    report = analyze([fp32_gemms(tmp_path, props)])
    amp = next(r for r in report.recommendations if r.id == "mixed_precision")
    assert f"dtype=torch.{dtype}" in amp.fix
    assert ("GradScaler" in amp.fix) == (dtype == "float16")
    # 600 µs of fp32 GEMM per 1000 µs step, 1.5-2x faster: 200-300 µs saved, the middle as the nominal
    g = amp.gain
    assert (g.step_s_saved_low, g.step_s_saved, g.step_s_saved_high) == pytest.approx((200 * US, 250 * US, 300 * US))
    assert g.basis == "modelled"
    assert g.assumption is not None
    assert "1.5–2×" in g.assumption
    assert amp.gain.step_s_after == pytest.approx(750 * US)  # the data wait stays
    assert amp.gain.speedup == pytest.approx(1000 / 750)
    assert amp.gain.utilization_after == pytest.approx(350 / 750)
    assert amp.gain.utilization_before == pytest.approx(600 / 1000)
    assert amp.gain.reason is not None
    assert amp.gain.reason.startswith("utilization over the steady steps falls")


def test_no_tensor_core_claim_on_pascal(tmp_path: Path) -> None:
    props = {"id": 0, "name": "Tesla P100-PCIE-16GB", "computeMajor": 6, "computeMinor": 0}
    amp = next(r for r in analyze([fp32_gemms(tmp_path, props)]).recommendations if r.id == "mixed_precision")
    assert amp.gain.step_s_saved is None
    assert amp.gain.reason is not None
    assert "no tensor cores" in amp.gain.reason


def test_rocm_wording(tmp_path: Path) -> None:
    from gpuidle.report.html import HtmlRenderer
    from gpuidle.report.terminal import TerminalRenderer

    props, _ = DEVICES["mi300x"]
    t = DeviceTrace(props)
    for n in range(3):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.launch(at=base, call_dur=10, start=base + 10, dur=300, name=ELEMENTWISE)
        t.launch(at=base + 20, call_dur=10, start=base + 400, dur=300, name=ALLREDUCE, stream=20)
    report = analyze([t.write(tmp_path / "amd.json.gz")])
    for text in (TerminalRenderer().render(report), HtmlRenderer().render(report)):
        assert "rocm-smi would count" in text
        assert "nvidia-smi" not in text


def no_cpu_events(tmp_path: Path) -> Path:
    """Kernels only, with idle between them: a trace recorded with ProfilerActivity.CUDA alone."""
    t = Trace()
    for n in range(4):
        t.x("kernel", ELEMENTWISE, n * 1000, 200, pid=0, tid=7, device=0, stream=7)
    return t.write(tmp_path / "gpu_only.json.gz")


def test_unattributed_idle_is_said_as_what_the_trace_lacks(tmp_path: Path) -> None:
    """Idle with no host event under it is a statement of what the trace lacks, with the recording change, never a
    fix: the fixes hold changes to the program only."""
    report = analyze([no_cpu_events(tmp_path)])
    assert not [r for r in report.recommendations if r.cause == "unattributed"]
    (q,) = [q for q in report.quality if q.kind == "host_unrecorded"]
    assert "no host operators or ranges recorded" in q.says
    assert q.recording is not None
    assert "ProfilerActivity.CPU" in q.recording


def test_the_profiler_arguments_exist() -> None:
    torch = pytest.importorskip("torch")
    import inspect

    params = inspect.signature(torch.profiler.profile.__init__).parameters
    assert {"activities", "schedule", "record_shapes", "with_stack", "on_trace_ready"} <= set(params)
    assert {"CPU", "CUDA"} <= set(torch.profiler.ProfilerActivity.__members__)


def test_falling_utilization_is_told_with_digits_that_differ() -> None:
    from gpuidle.advice.whatif import _distinct_percents

    assert _distinct_percents(0.70412, 0.58201) == ("70.4", "58.2")
    assert _distinct_percents(0.005123, 0.004812) == ("0.51", "0.48")
    assert _distinct_percents(0.5, 0.5) == ("50.000", "50.000")


def test_a_trace_of_device_events_alone_says_so_first(tmp_path: Path) -> None:
    """No host event recorded: the headline says the idle cannot be split, and the block above the fixes how to record
    it."""
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.terminal import TerminalRenderer

    report = analyze([no_cpu_events(tmp_path)])
    (rank,) = report.ranks
    assert rank.unmeasured == ["host_activity"]
    assert not report.recommendations
    text = TerminalRenderer().render(report, RenderOptions(width=200))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("rank 0 · device"))
    headline = " ".join(lines[at:at + 3])  # the device, its idle, and what was not measured
    assert "host activity not recorded" in headline
    assert text.index("What this trace can tell") < text.index("Nothing to fix")
    assert "ProfilerActivity.CPU" in text


def test_every_format_says_what_the_trace_lacks_above_the_fixes(tmp_path: Path) -> None:
    from gpuidle.report.html import HtmlRenderer
    from gpuidle.report.jsonout import JsonRenderer
    from gpuidle.report.markdown import MarkdownRenderer

    report = analyze([no_cpu_events(tmp_path)])
    md = MarkdownRenderer().render(report)
    assert md.index("### What this trace can tell") < md.index("Nothing to fix")
    assert "### Top fixes" not in md
    page = HtmlRenderer().render(report)
    assert page.index('<section id="quality">') < page.index('<section id="recommendations">')
    assert '"kind":"host_unrecorded"' in JsonRenderer().render(report).replace(" ", "")
