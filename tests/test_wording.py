"""Fixes in the words of the hardware and the program the trace shows: AMD's matrix cores and MIOpen, a serving
engine's own CUDA-graph switch, torch.compile's mode for a compiled model, inference snippets for inference.

Each trace is hand-built; the figures it must give are worked out in the comments."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuidle.api import analyze
from gpuidle.model import AnalysisReport, Recommendation
from gpuidle.report.html import HtmlRenderer
from gpuidle.report.terminal import TerminalRenderer
from minitrace import Trace

US = 1e-6
MI250X = {"id": 0, "name": "AMD Instinct MI250X", "computeMajor": 9, "computeMinor": 0}
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0}
TENSILE_FP32 = "Cijk_Ailk_Bljk_SB_MT128x128x16_MI32x32x2_SN_{arch}"
"""rocBLAS/hipBLASLt's Tensile GEMM, single precision (``SB``), built for ``arch``."""
MIOPEN_FP32 = "miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1"
CUDA_ONLY = ("tensor core", "tensor-core", "nvidia-smi", "allow_tf32", "tf32", "nvtx", "cudagraph", "nsys",
             "cublas")
"""Lower-cased words that name NVIDIA hardware or CUDA-only APIs (``torch.cuda.*`` and ``device_type="cuda"`` are
PyTorch's own names on ROCm builds too, and stay)."""
TRAINING_WORDS = ("optimizer", "backward", "gradscaler", "train_step", "loss", "dataloader", "epoch", "lr ")
BACKWARD = "autograd::engine::evaluate_function: MmBackward0"


def write(t: Trace, path: Path, props: dict[str, Any] | None) -> Path:
    """The trace with ``props`` as its only ``deviceProperties`` (None: none recorded)."""
    doc = t.to_dict()
    if props is None:
        del doc["deviceProperties"]
    else:
        doc["deviceProperties"] = [props]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def by_id(report: AnalysisReport) -> dict[str, Recommendation]:
    return {r.id: r for r in report.recommendations}


def text_of(report: AnalysisReport) -> str:
    """Everything a reader sees of the fixes: titles, fixes, evidence, gains, and both rendered reports."""
    recs = json.dumps([{"title": r.title, "fix": r.fix, "evidence": r.evidence, "reason": r.gain.reason,
                        "assumption": r.gain.assumption} for r in report.recommendations], ensure_ascii=False)
    return "\n".join((recs, TerminalRenderer().render(report), HtmlRenderer().render(report)))


# -- hardware -------------------------------------------------------------------------------------------


def gemm_conv_trace(gemm: str, conv: str, call: str) -> Trace:
    """Per 1000 µs step: a 500 µs fp32 GEMM and a 250 µs fp32 convolution, each launched by its operator."""
    t = Trace()
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.op("aten::mm", base, 20)
        t.launch(at=base, call_dur=10, start=base + 10, dur=500, name=gemm, call=call)
        t.op("aten::convolution", base + 20, 20)
        t.launch(at=base + 20, call_dur=10, start=base + 510, dur=250, name=conv, call=call)
    return t


def test_amd_wording_says_matrix_cores_and_miopen(tmp_path: Path) -> None:
    """An MI250X (CDNA2: bf16 matrix cores) behind hipLaunchKernel: the precision fix in bf16 on the matrix cores,
    the convolution fix naming MIOpen, and no NVIDIA-only word anywhere in the report."""
    trace = gemm_conv_trace(TENSILE_FP32.format(arch="gfx90a"), MIOPEN_FP32, "hipLaunchKernel")
    report = analyze([write(trace, tmp_path / "mi250x.json.gz", MI250X)])
    recs = by_id(report)
    amp = recs["mixed_precision"]
    assert amp.evidence["hardware"] == "AMD Instinct MI250X"
    assert amp.evidence["dtype"] == "bf16"
    assert amp.evidence["assumption"] == "fp32 GEMM/conv time shrinks 1.5–2× on the matrix cores"
    assert "dtype=torch.bfloat16" in amp.fix
    assert "GradScaler" not in amp.fix
    assert amp.confidence == "medium"
    # 750 µs of fp32 GEMM and convolution per step, 1.5-2x faster: 250-375 µs saved, the middle nominal
    g = amp.gain
    assert (g.step_s_saved_low, g.step_s_saved, g.step_s_saved_high) == pytest.approx(
        (750 * (1 - 1 / 1.5) * US, 750 * (1 - (1 / 1.5 + 1 / 2) / 2) * US, 750 * (1 - 1 / 2) * US))
    conv = recs["cudnn_benchmark"]
    assert conv.title == "Convolutions dominate: let MIOpen pick the fastest algorithms for your shapes"
    assert conv.fix.startswith("torch.backends.cudnn.benchmark = True")
    assert "torch.backends.cudnn drives MIOpen" in conv.fix
    assert conv.gain.reason == ("a trace does not hold the algorithms MIOpen would pick; "
                                "helps only with fixed input shapes")
    text = text_of(report)
    assert "matrix cores" in text
    assert "cuDNN" not in text
    assert [w for w in CUDA_ONLY if w in text.lower()] == []


def test_the_same_trace_on_nvidia_says_tensor_cores_and_cudnn(tmp_path: Path) -> None:
    """The control: the words above follow the hardware, not the trace's shape."""
    trace = gemm_conv_trace("ampere_sgemm_128x64_nn", "cudnn::cnn::implicit_convolve_sgemm", "cudaLaunchKernel")
    report = analyze([write(trace, tmp_path / "a100.json.gz", A100)])
    recs = by_id(report)
    assert recs["mixed_precision"].evidence["assumption"] == "fp32 GEMM/conv time shrinks 1.5–2× on the tensor cores"
    assert recs["cudnn_benchmark"].title == ("Convolutions dominate: let cuDNN pick the fastest algorithms "
                                             "for your shapes")
    assert "MIOpen" not in recs["cudnn_benchmark"].fix
    assert "matrix cores" not in text_of(report)


@pytest.mark.parametrize(("arch", "family"), [("gfx90a", "cdna2"), ("gfx942", "cdna3")])
def test_gfx_kernels_tell_the_amd_generation_without_device_properties(tmp_path: Path, arch: str, family: str) -> None:
    """No deviceProperties: the Tensile kernel's gfx target says CDNA2/CDNA3, both with bf16 matrix cores. (Read
    as the generic ROCm family, the device was 'no compute capability' and got fp16 with a GradScaler.)"""
    trace = gemm_conv_trace(TENSILE_FP32.format(arch=arch), MIOPEN_FP32, "hipLaunchKernel")
    report = analyze([write(trace, tmp_path / "amd.json.gz", None)])
    d = report.ranks[0].primary()
    assert (d.name, d.compute_capability, d.kernel_arch) == (None, None, family)
    amp = by_id(report)["mixed_precision"]
    assert amp.evidence["hardware"] == f"{family} kernels"
    assert amp.evidence["dtype"] == "bf16"
    assert amp.evidence["assumption"] == "fp32 GEMM/conv time shrinks 1.5–2× on the matrix cores"
    assert "dtype=torch.bfloat16" in amp.fix
    assert "GradScaler" not in amp.fix
    assert amp.confidence == "medium"
    assert [w for w in CUDA_ONLY if w in text_of(report).lower()] == []


# -- workload -------------------------------------------------------------------------------------------


def launch_bound(tmp_path: Path, op: str, kernel: str, call: str = "cudaLaunchKernel", region: str | None = None,
                 training: bool = False) -> AnalysisReport:
    """Per 1000 µs step, 50 launches 20 µs apart: each operator's 12 µs launch call, then its 8 µs kernel. The
    device idles only under the calls: 50 × 12 = 600 µs of launch overhead per step, all of it short kernels."""
    t = Trace()
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        if region is not None:
            t.op(region, base, 1000)
        for i in range(50):
            at = base + 20 * i
            t.op(op, at, 12)
            t.launch(at=at, call_dur=12, start=at + 12, dur=8, name=kernel, call=call)
        if training:
            t.op(BACKWARD, base + 13, 5)                                # inside a kernel: no idle changes
    return analyze([t.write(tmp_path / "launch_bound.json.gz")])


ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
GRAPH_CASES = {
    # name: (operator, kernel, launch call, region), workload, title, what the fix must say
    "eager": (("aten::add", ELEMENTWISE, "cudaLaunchKernel", None), ("inference", "eager", None),
              'Launch-bound: capture the step with CUDA graphs (torch.compile mode="reduce-overhead")',
              'model = torch.compile(model, mode="reduce-overhead")'),
    "compiled": (("aten::add", "triton_poi_fused_add_0", "cudaLaunchKernel", "Torch-Compiled Region: 0/0"),
                 ("inference", "compiled", None),
                 'Launch-bound although compiled: let torch.compile replay CUDA graphs (mode="reduce-overhead")',
                 'model = torch.compile(model, mode="reduce-overhead")   # the default mode still launches'),
    "replaying": (("aten::add", ELEMENTWISE, "cudaGraphLaunch", None), ("inference", "cuda_graphs", None),
                  "Launch-bound outside the replayed CUDA graphs: capture the rest of the step",
                  "TORCH_LOGS=graph_breaks,cudagraphs python serve.py"),
    "vllm": (("vllm::unified_attention", "void vllm::rms_norm_kernel<c10::BFloat16>", "cudaLaunchKernel", None),
             ("inference", "eager", "vllm"), "Launch-bound: run vLLM with CUDA graphs (it runs eagerly now)",
             "llm = LLM(model=model_name, enforce_eager=False)"),
    "sglang": (("sglang::inplace_fused_experts", ELEMENTWISE, "cudaLaunchKernel", None),
               ("inference", "eager", "sglang"), "Launch-bound: run SGLang with CUDA graphs (it runs eagerly now)",
               "python -m sglang.launch_server --model-path MODEL   # without --disable-cuda-graph"),
}


@pytest.mark.parametrize("case", sorted(GRAPH_CASES))
def test_the_cuda_graph_fix_fits_how_the_program_runs(tmp_path: Path, case: str) -> None:
    (op, kernel, call, region), (mode, execution, engine), title, says = GRAPH_CASES[case]
    report = launch_bound(tmp_path, op, kernel, call, region)
    w = report.ranks[0].workload
    assert w is not None
    assert (w.mode, w.execution, w.engine) == (mode, execution, engine)
    rec = by_id(report)["cuda_graphs"]
    assert rec.title == title
    assert says in rec.fix
    assert rec.evidence["execution"] == execution
    assert rec.evidence["launch_overhead_ms_per_step"] == pytest.approx(50 * 12 * 1e-3)
    # graph replay removes half to all of the 600 µs per step
    g = rec.gain
    assert (g.step_s_saved_low, g.step_s_saved, g.step_s_saved_high) == pytest.approx((300 * US, 450 * US, 600 * US))
    if engine is not None:   # the engine's switch, not torch.compile on a model the engine owns
        assert "torch.compile" not in rec.fix


ENGINE_BATCH_CASES = {
    "vllm": ("vllm::unified_attention", "Tiny kernels starve the GPU: let vLLM batch more sequences per step",
             "vllm serve MODEL --max-num-seqs N --max-num-batched-tokens T"),
    "sglang": ("sglang::inplace_fused_experts", "Tiny kernels starve the GPU: let SGLang run more requests per step",
               "python -m sglang.launch_server --model-path MODEL --max-running-requests N --cuda-graph-max-bs N"),
}


@pytest.mark.parametrize("engine", sorted(ENGINE_BATCH_CASES))
def test_an_engine_replaying_graphs_gets_its_own_batch_fix(tmp_path: Path, engine: str) -> None:
    """The engine already replays CUDA graphs: nothing of this kind is left to advise; the batch fix takes the
    idle, written as the engine's scheduler limits (a serving engine owns the model's call: no torch.cat)."""
    op, title, says = ENGINE_BATCH_CASES[engine]
    report = launch_bound(tmp_path, op, ELEMENTWISE, "cudaGraphLaunch")
    w = report.ranks[0].workload
    assert w is not None
    assert (w.execution, w.engine) == ("cuda_graphs", engine)
    recs = by_id(report)
    assert "cuda_graphs" not in recs
    batch = recs["larger_batch"]
    assert batch.alternative_to is None
    assert batch.title == title
    assert batch.fix.startswith(says)
    assert "torch" not in batch.fix
    assert "model(" not in batch.fix


@pytest.mark.parametrize(("training", "script"), [(False, "serve.py"), (True, "train.py")])
def test_the_program_named_is_the_one_that_runs(tmp_path: Path, training: bool, script: str) -> None:
    """A compiled model's graph-break hunt runs the training script for training, the server for inference."""
    report = launch_bound(tmp_path, "aten::add", "triton_poi_fused_add_0", region="Torch-Compiled Region: 0/0",
                          training=training)
    fix = by_id(report)["cuda_graphs"].fix
    assert f"TORCH_LOGS=graph_breaks python {script} lists them" in fix
    assert ("train.py" in fix) is training


def serving_step(tmp_path: Path, training: bool, engine: str | None = None,
                 python: str = "serve.py(42): postprocess") -> AnalysisReport:
    """Per 2000 µs step: the GEMM's operator dispatches and launches it over [0, 15) (launch overhead), the fp32
    GEMM runs [15, 815); [815, 820) nothing; ``.item()`` [820, 1120) waits on a synchronize (host sync); Python
    post-processing [1120, 1520) launches nothing (host work); nothing recorded from 1520 to 2000."""
    t = Trace()
    for n in range(4):
        base = n * 2000
        t.step(n + 1, base, 2000)
        t.op(f"{engine}::model_runner" if engine else "aten::mm", base, 20)
        t.launch(at=base + 5, call_dur=10, start=base + 15, dur=800, name="volta_sgemm_128x64_nn")
        if training:
            t.op(BACKWARD, base + 100, 10)                              # inside the GEMM: no idle changes
        t.op("aten::item", base + 820, 300)
        t.runtime("cudaStreamSynchronize", base + 825, 290)
        t.x("python_function", python, base + 1120, 400)
    return analyze([t.write(tmp_path / "serve.json.gz")])


@pytest.mark.parametrize(("engine", "graphs"), [
    ("vllm", "llm = LLM(model=model_name, enforce_eager=False)"),
    ("sglang", "without --disable-cuda-graph"),
])
def test_host_work_in_the_models_own_forward_is_met_with_graphs(tmp_path: Path, engine: str, graphs: str) -> None:
    """The Python under an engine's idle is the model's forward and its MoE routing: nothing to move off the serving
    thread; replaying the forward as a CUDA graph is the fix."""
    frame = f"{engine}/model_executor/models/deepseek_v2.py(512): forward"
    fix = by_id(serving_step(tmp_path, training=False, engine=engine, python=frame))["move_cpu_work"]
    assert "the model's own forward: replay it as a CUDA graph" in fix.fix
    assert graphs in fix.fix
    assert "off the serving thread" not in fix.fix
    assert fix.evidence["python_in_model_forward_share"] == 1.0


def test_inference_gets_inference_snippets(tmp_path: Path) -> None:
    """Without a backward pass or an optimizer step in the trace, every fix is written for serving."""
    report = serving_step(tmp_path, training=False)
    w = report.ranks[0].workload
    assert w is not None
    assert w.mode == "inference"
    recs = by_id(report)
    assert {"remove_host_sync", "mixed_precision", "move_cpu_work"} <= set(recs)
    assert "record_cpu_activity" not in recs   # what the trace lacks is said above the fixes, never as one
    idle = {k: v for k, v in report.ranks[0].primary().idle_by_cause_s.items() if v}
    assert idle == pytest.approx({"launch_overhead": 4 * 15 * US, "host_sync": 4 * 300 * US,
                                  "cpu_compute": 4 * 400 * US, "unattributed": 4 * (5 + 480) * US})
    assert "out_host.copy_(out, non_blocking=True)" in recs["remove_host_sync"].fix
    assert recs["mixed_precision"].fix.startswith("with torch.inference_mode(), torch.autocast(")
    assert "off the serving thread" in recs["move_cpu_work"].fix
    for rec in report.recommendations:
        assert [w for w in TRAINING_WORDS if w in rec.fix.lower()] == [], rec.id


@pytest.mark.parametrize(("engine", "fix"), [
    ("vllm", 'vllm serve MODEL --dtype float16   # offline: LLM(model=model_name, dtype="float16")'),
    ("sglang", "python -m sglang.launch_server --model-path MODEL --dtype float16"),
])
def test_an_engine_runs_in_16_bits_by_its_dtype(tmp_path: Path, engine: str, fix: str) -> None:
    """fp32 GEMMs in a serving engine: the engine loads and runs the model in the dtype it is given (fp16 on a
    V100, which has no bf16 matrix units); no autocast around a model call the engine owns."""
    report = serving_step(tmp_path, training=False, engine=engine)
    amp = by_id(report)["mixed_precision"]
    assert amp.title == "GEMMs/convolutions run in fp32: load the model in 16 bits"
    assert amp.fix == fix
    assert amp.gain.basis == "modelled"


def test_a_compiled_model_is_not_told_to_compile(tmp_path: Path) -> None:
    """Host work between the launches of a model under torch.compile is its wrapper's Python: the fix replays CUDA
    graphs, and no plain ``torch.compile(model)`` is offered for a model that already is."""
    t = Trace()
    for n in range(4):
        base = n * 2000
        t.step(n + 1, base, 2000)
        t.annotation("Torch-Compiled Region: 0/0", base, 1600)
        t.op(BACKWARD, base + 2, 3)
        t.launch(at=base + 5, call_dur=10, start=base + 15, dur=800, name="triton_poi_fused_add_0")
        t.op("inductor::assert_size_stride", base + 820, 700)
        t.launch(at=base + 1530, call_dur=10, start=base + 1545, dur=400, name="triton_per_fused_sum_1")
    report = analyze([t.write(tmp_path / "compiled.json.gz")])
    w = report.ranks[0].workload
    assert w is not None
    assert w.execution == "compiled"
    fix = by_id(report)["move_cpu_work"].fix
    assert 'model = torch.compile(model, mode="reduce-overhead")' in fix
    assert "model = torch.compile(model)\n" not in fix


def test_training_keeps_the_training_snippets(tmp_path: Path) -> None:
    """The control: one autograd operator in the same trace, and the fixes are the training ones."""
    report = serving_step(tmp_path, training=True)
    w = report.ranks[0].workload
    assert w is not None
    assert w.mode == "training"
    recs = by_id(report)
    assert "running_loss += loss.detach()" in recs["remove_host_sync"].fix
    assert "scaler.step(optimizer)" in recs["mixed_precision"].fix      # volta kernels: fp16 with loss scaling
    assert "DataLoader workers" in recs["move_cpu_work"].fix


ALLREDUCE_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.mark.parametrize("training", [False, True])
def test_tensor_parallel_inference_gets_no_gradient_fixes(tmp_path: Path, training: bool) -> None:
    """vLLM with two-way tensor parallelism: an exposed 4 MiB fp32 all-reduce after each of three layers. There
    are no gradients: no no_sync, no comm hook, no batch-and-learning-rate fix. (Before, an unlabelled
    all-reduce-only trace was read as DDP whatever it ran: 'Gradients are all-reduced on each of 3 micro-batches'
    with optimizer.step().) With a backward pass the same collectives are gradient all-reduces again."""
    t = Trace(rank=0, world=2)
    for n in range(4):
        base = n * 2000
        t.step(n + 1, base, 2000)
        for layer in range(3):
            at = base + layer * 600
            t.op("vllm::unified_attention", at, 40)
            t.launch(at=at, call_dur=10, start=at + 10, dur=290, name="void vllm::paged_attention_v1_kernel<float>")
            if training:
                t.op(BACKWARD, at + 100, 10)                            # inside the kernel: no idle changes
            t.op("record_param_comms", at + 50, 20, **{
                "Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 1 << 20,
                "Out msg nelems": 1 << 20, "dtype": "Float", "Group size": 2})
            t.launch(at=at + 55, call_dur=5, start=at + 300, dur=250, stream=20, name=ALLREDUCE_F32)
    report = analyze([t.write(tmp_path / "tp.json.gz")])
    rank = report.ranks[0]
    # 3 × 250 µs of all-reduce per step with nothing else on the device
    assert rank.primary().idle_by_cause_s["communication"] == pytest.approx(4 * 3 * 250 * US)
    gradient_fixes = {"ddp_no_sync", "ddp_bucket_cap", "comm_compression", "comm_bound_batch"}
    ids = {r.id for r in report.recommendations}
    if training:
        assert {"ddp_no_sync", "comm_compression"} <= ids
        assert rank.communication.parallelism == "ddp"
        assert "data parallel: DDP" in text_of(report)
    else:
        assert ids & gradient_fixes == set()
        assert rank.communication.parallelism == "tensor_parallel"
        assert "tensor parallel (inference" in text_of(report)
        assert "data parallel" not in text_of(report)
        assert not re.search(r"gradient|optimizer|no_sync|comm_hook", text_of(report), re.IGNORECASE)


def test_the_causes_mean_in_the_docs_what_the_reports_say() -> None:
    """The one-line meanings the reports print are the docs' table, word for word, one for every cause."""
    from gpuidle.model import CAUSES
    from gpuidle.report.common import CAUSE_MEANING

    page = (Path(__file__).parent.parent / "docs" / "numbers.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", page, re.M))
    assert list(CAUSE_MEANING) == [c.value for c in CAUSES]
    assert {c: rows[c] for c in CAUSE_MEANING} == CAUSE_MEANING


def test_where_steps_come_from_reads_in_the_docs_as_the_reports_say() -> None:
    """The window line's words for each step source are the docs' table, word for word."""
    from gpuidle.report.common import STEP_SOURCE_WORDS

    page = (Path(__file__).parent.parent / "docs" / "numbers.md").read_text()
    rows = dict(re.findall(r"^\| `([\w:]+)` \| (.+?) \|$", page, re.M))
    assert {c: rows[c] for c in STEP_SOURCE_WORDS} == STEP_SOURCE_WORDS


def test_the_engine_is_named_by_the_host_not_by_one_kernels_template(tmp_path: Path) -> None:
    """An SGLang run whose fused MoE kernel is templated on a vLLM type: SGLang's own host events name the engine;
    a trace whose host names none takes the engine its kernels name."""
    def engine_of(host_names: list[str], kernel: str) -> str | None:
        t = Trace()
        for n in range(3):
            base = n * 1000
            t.step(n, base, 1000)
            for name in host_names:
                t.op(name, base + 1, 2)
            t.launch(at=base + 5, call_dur=5, start=base + 20, dur=900, name=kernel)
        w = analyze([t.write(tmp_path / f"engine{len(host_names)}.json.gz")]).ranks[0].workload
        assert w is not None
        return w.engine

    vllm_kernel = "void vllm::moe::moe_align_block_size_kernel<int>(int*, int*, int*)"
    assert engine_of(["sglang::scheduler::run_batch", "aten::mm"], vllm_kernel) == "sglang"
    assert engine_of(["aten::mm"], vllm_kernel) == "vllm"
    assert engine_of(["aten::mm"], "volta_sgemm_128x64_nn") is None
