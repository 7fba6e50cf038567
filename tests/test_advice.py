"""Recommendations: fired by evidence, gains computed from the measured idle, fixes that use real APIs."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.api import analyze
from minitrace import Trace

US = 1e-6


def loader_bound(tmp_path: Path) -> Path:
    t = Trace()
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base, 600)
        t.launch(at=base + 600, call_dur=10, start=base + 620, dur=380)
    return t.write(tmp_path / "loader.json.gz")


def test_dataloader_rule_gain_is_the_measured_wait(tmp_path: Path) -> None:
    report = analyze([loader_bound(tmp_path)])
    top = report.recommendations[0]
    assert top.id == "dataloader_workers"
    assert top.cause == "data_loading"
    assert top.confidence == "high"
    # 600 µs of every 1000 µs step is spent in __next__; removing it leaves 380 busy of 400
    assert top.gain.step_s_saved == pytest.approx(600 * US)
    assert top.gain.utilization_after == pytest.approx(380 / 400)
    assert top.evidence["data_loading_ms_per_step"] == pytest.approx(0.6)
    assert "num_workers" in top.fix
    assert "pin_memory=True" in top.fix


def test_sorted_by_gain_and_nothing_below_threshold(tmp_path: Path) -> None:
    report = analyze([loader_bound(tmp_path)])
    gains = [r.gain.step_s_saved for r in report.recommendations if r.alternative_to is None]
    known = [g for g in gains if g is not None]
    assert known == sorted(known, reverse=True)
    assert gains[: len(known)] == known  # gains that cannot be estimated come last
    assert not any(r.cause == "host_sync" for r in report.recommendations)


def test_host_sync_rule(tmp_path: Path) -> None:
    t = Trace()
    for n in range(3):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.launch(at=base, call_dur=10, start=base + 10, dur=390)
        t.op("aten::item", base + 20, 580)
        t.op("aten::_local_scalar_dense", base + 25, 570)
        t.runtime("cudaStreamSynchronize", base + 30, 560)
        t.launch(at=base + 600, call_dur=10, start=base + 620, dur=380)
    report = analyze([t.write(tmp_path / "sync.json.gz")])
    rec = next(r for r in report.recommendations if r.id == "remove_host_sync")
    assert rec.gain.step_s_saved == pytest.approx(200 * US)  # [400, 600): blocked in .item()
    assert rec.evidence["item_calls_per_step"] == 1
    assert rec.evidence["sync_calls_per_step"] == 1
    assert "set_sync_debug_mode" in rec.fix


def test_no_apis_that_do_not_exist() -> None:
    reports = [analyze([DATA / n]) for n in ("nccl_parser_config__nccl_data.json.gz",
                                             "trace_filter__sampled_rank-0.json.gz")]
    text = "\n".join(r.fix for rep in reports for r in rep.recommendations)
    assert "torch.distributed.bucket_cap_mb" not in text
    assert "DistributedOptimizer" not in text
    assert "bucket_cap_mb=" in text or "torch.compile" in text


API_NAMES = [
    "torch.utils.data.DataLoader",
    "torch.cuda.set_sync_debug_mode",
    "torch.autocast",
    "torch.amp.GradScaler",
    "torch.compile",
    "torch.cuda.make_graphed_callables",
    "torch.backends.cudnn.benchmark",
    "torch.nn.parallel.DistributedDataParallel.no_sync",
    "torch.nn.parallel.DistributedDataParallel.register_comm_hook",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook",
    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState",
    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook",
    "torch._inductor.config._micro_pipeline_tp",
    "torch.distributed._symmetric_memory.enable_symm_mem_for_group",
    "torch.distributed.pipelining.ScheduleInterleaved1F1B",
    "torch.distributed.pipelining.ScheduleInterleavedZeroBubble",
    "torch.distributed.tensor.parallel.SequenceParallel",
    "torch.distributed.tensor.experimental.context_parallel",
    "torch.distributed.tensor.experimental._attention.set_rotate_method",
]


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", API_NAMES)
def test_the_apis_we_print_exist_in_torch(dotted: str) -> None:
    pytest.importorskip("torch")
    assert _resolve(dotted) is not None


def test_keyword_arguments_we_print_exist() -> None:
    pytest.importorskip("torch")
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    ddp = inspect.signature(DistributedDataParallel.__init__).parameters
    assert {"bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "device_ids"} <= set(ddp)
    loader = inspect.signature(DataLoader.__init__).parameters
    assert {"num_workers", "pin_memory", "persistent_workers", "prefetch_factor"} <= set(loader)
    power = inspect.signature(PowerSGDState.__init__).parameters
    assert {"process_group", "matrix_approximation_rank", "start_powerSGD_iter"} <= set(power)


def test_a_gain_that_cannot_be_estimated_says_so_once(tmp_path: Path) -> None:
    """Convolutions dominate: cuDNN's benchmark mode is advised, its gain not estimated, in one plain clause."""
    from gpuidle.report.common import gain_text

    t = Trace()
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.launch(at=base + 10, call_dur=10, start=base + 50, dur=900, name="cudnn_convolution_fprop_kernel")
    report = analyze([t.write(tmp_path / "conv.json.gz")])
    (rec,) = [r for r in report.recommendations if r.id == "cudnn_benchmark"]
    assert rec.gain.step_s_saved is None
    text = gain_text(rec)
    assert text.startswith("gain not estimable: ")
    assert text.count("estimable") == 1
    assert "cuDNN" in text


def test_a_cause_no_rule_claims_is_said_with_its_share() -> None:
    """With no rule firing (here: none given), every idle cause of a tenth of the step or more is still named, with
    its share and no gain; none below it."""
    from gpuidle.advice.rules import recommend
    from gpuidle.api import analyze
    from gpuidle.model import CAUSES

    report = analyze([Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"])
    (rank,) = report.ranks
    said = {p.rec.cause: p.rec for p in recommend(rank, rules=[])[0]}
    steady = [s for s in rank.steps if s.excluded is None]
    step = sum(s.dur_s for s in steady) / len(steady)
    for c in CAUSES:
        if c.value in ("straggler_wait", "unattributed"):
            continue
        share = sum(s.idle_by_cause_s[c.value] for s in steady) / len(steady) / step
        assert (c.value in said) == (share >= 0.10), c
        if c.value in said:
            assert said[c.value].id == f"unsized_{c.value}"
            assert said[c.value].evidence["share_of_step"] == pytest.approx(share, abs=5e-4)


@pytest.mark.parametrize(("every", "steps", "estimable"), [(8, 8, False), (4, 8, True), (1, 8, True), (5, 5, False)])
def test_a_per_step_gain_needs_a_cause_that_recurs(tmp_path: Path, every: int, steps: int, estimable: bool) -> None:
    """A 4 ms ``.item()`` wait every ``every``-th of ``steps`` steps of 10 ms: once in the window is an outlier (the
    fix is named, its gain not estimable, and the report says why); every fourth step is a recurring cost, its mean
    per step the gain."""
    t = Trace()
    for n in range(steps):
        base = n * 10_000.0
        t.step(n, base, 10_000)
        t.launch(at=base, call_dur=5, start=base + 10, dur=4_000)
        if n % every == every - 1:
            t.op("aten::item", base + 4_010, 4_000)  # waits on work the trace does not show
            t.runtime("cudaStreamSynchronize", base + 4_015, 3_990)
        t.launch(at=base + 8_030, call_dur=5, start=base + 8_040, dur=1_950)
    report = analyze([t.write(tmp_path / f"sync{every}.json.gz")])
    (fix,) = [r for r in report.recommendations if r.id == "remove_host_sync"]
    occurrences = steps // every
    if estimable:
        assert fix.gain.step_s_saved == pytest.approx(occurrences * 4_000e-6 / steps, rel=0.01)
    else:
        assert fix.gain.step_s_saved is None
        assert fix.gain.reason is not None
        last = steps - 1
        assert (f"host_sync is in 1 of {steps} steady steps (step {last}: 4.00 ms under one cudaStreamSynchronize "
                "call of 3.99 ms): not a per-step cause") in fix.gain.reason
