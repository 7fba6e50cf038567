"""Numeric precision fixes for GEMM and convolution time: TF32 first where the device has it, then 16 bits.

Both draw on one pool, the fp32 GEMM/conv time that runs on the SIMT cores (kernel names: ``sgemm``, not
``tensorop``/``xmma``/``tf32``): they are alternatives, never added. TF32 is one line, keeps fp32 storage and
needs no change to the model's numerics beyond the multiply's input rounding, so where both apply it comes
first by its range; 16-bit autocast follows as its alternative.
"""

from __future__ import annotations

from gpuidle.advice.frameworks import engine_precision
from gpuidle.advice.hardware import CUDA, UNKNOWN, amp_dtype, amp_snippet
from gpuidle.advice.ruleinput import COMPUTE, RuleInput, _ms, removes_between
from gpuidle.advice.whatif import Effect, Proposal

FP32_MATMUL = "fp32_matmul"
"""The pool both fixes claim: the fp32 GEMM/conv time on the SIMT cores."""
MIN_GEMM_SHARE = 0.3
"""GEMMs and convolutions must be this share of kernel time for their precision to matter..."""
MAX_MATRIX_SHARE = 0.5
"""...and at most this share of them already on the matrix units (16 bits, TF32)."""

AMP_SPEEDUP_LOW, AMP_SPEEDUP_HIGH = 1.5, 2.0
"""Speed-up of a GEMM/conv's time moved from fp32 to fp16/bf16 matrix units: the conservative end of
what mixed precision measures in training (the datasheets' peak ratios are 2× TF32 and 8-16× plain
fp32 on V100-H100; real GEMMs reach a fraction of peak, and memory-bound layers gain less)."""
TF32_SPEEDUP_LOW, TF32_SPEEDUP_HIGH = 2.0, 4.0
"""Speed-up of fp32 SIMT GEMM/conv time run as TF32 on the tensor cores: the datasheets' dense peaks are 8×
(A100: 156 vs 19.5 TFLOPS) and 7.4× (H100 SXM: 495 vs 67); real GEMMs reach a smaller share of the tensor
cores' peak than of the SIMT cores', and small or memory-bound ones gain less, hence half of it and below."""

TF32_FIX = (
    "torch.set_float32_matmul_precision(\"high\")          # fp32 matmuls run as TF32 on the tensor cores;\n"
    "                                                     # weights and activations stay fp32\n"
    "torch.backends.cudnn.conv.fp32_precision = \"tf32\"   # convolutions (PyTorch < 2.9: "
    "torch.backends.cudnn.allow_tf32 = True)"
)


def _fp32_matmul(x: RuleInput) -> tuple[float, dict[str, object]] | None:
    """The fp32 SIMT GEMM/conv seconds per step and their evidence, where precision is worth a fix."""
    k = x.report.kernels
    if k.reduced_precision_gemm_share is None or k.reduced_precision_gemm_share > MAX_MATRIX_SHARE \
            or k.gemm_share < MIN_GEMM_SHARE:
        return None
    seconds = x.per_window_step(k.total_s * k.gemm_share * (1 - k.reduced_precision_gemm_share))
    return seconds, {
        "gemm_share_of_kernel_time": round(k.gemm_share, 3),
        "reduced_precision_share_of_gemm": round(k.reduced_precision_gemm_share, 3),
        "fp32_gemm_ms_per_step": _ms(seconds), "hardware": x.hw.label,
    }


def tf32(x: RuleInput) -> list[Proposal]:
    """On NVIDIA Ampere and later (sm >= 80), fp32 GEMMs/convolutions on the SIMT cores: turn on TF32."""
    found = _fp32_matmul(x)
    hw = x.hw
    if found is None or hw.platform != CUDA or hw.capability is None or hw.capability < (8, 0) \
            or (x.report.workload is not None and x.report.workload.engine):
        return []
    seconds, evidence = found
    evidence["assumption"] = (f"fp32 GEMM/conv time shrinks {TF32_SPEEDUP_LOW:g}–{TF32_SPEEDUP_HIGH:g}× as TF32 "
                              "on the tensor cores")
    effect = removes_between(1 - 1 / TF32_SPEEDUP_LOW, 1 - 1 / TF32_SPEEDUP_HIGH, busy=seconds, pools=(FP32_MATMUL,))
    return [x.rec(
        "tf32", COMPUTE, "GEMMs/convolutions run in plain fp32 on the SIMT cores: turn on TF32 (one line)",
        evidence, TF32_FIX, effect, confidence="medium",
    )]


def mixed_precision(x: RuleInput) -> list[Proposal]:
    """fp32 GEMMs/convolutions: compute them in 16 bits (autocast), or load an engine's model in 16 bits."""
    found = _fp32_matmul(x)
    if found is None:
        return []
    seconds, evidence = found
    hw = x.hw
    evidence["dtype"] = "bf16" if hw.bf16 else "fp16"
    units = hw.matrix_units
    if hw.tensor_cores is False:
        effect = Effect(reason=f"{hw.label} has no {units}: fp16 halves memory traffic, "
                               "but the GEMM speed-up cannot be estimated")
    else:
        speedup = f"{AMP_SPEEDUP_LOW:g}–{AMP_SPEEDUP_HIGH:g}×"
        evidence["assumption"] = f"fp32 GEMM/conv time shrinks {speedup} on the {units}" + (
            "; hardware unknown: precision advice assumes a tensor-core GPU" if hw.platform == UNKNOWN else
            f"; the trace records no compute capability: {units} assumed" if hw.tensor_cores is None else "")
        effect = removes_between(1 - 1 / AMP_SPEEDUP_LOW, 1 - 1 / AMP_SPEEDUP_HIGH, busy=seconds,
                                 pools=(FP32_MATMUL,))
    engine = engine_precision(x.report.workload, amp_dtype(hw))
    title = "GEMMs/convolutions run in fp32: " + ("load the model in 16 bits" if engine else
                                                  "use mixed precision (torch.autocast)")
    return [x.rec(
        "mixed_precision", COMPUTE, title, evidence, engine or amp_snippet(hw, x.inference), effect,
        confidence="medium" if hw.tensor_cores else "low",
    )]


CAST_SHARE = 0.1
"""Cast kernels this share of kernel time or more are worth naming: a forward that re-casts its fp32 weights to 16
bits at every use spends a GEMM's worth of memory traffic on each."""
CAST_KEPT = (0.5, 1.0)
"""Of the casts' device time, what casting once (inference) or fusing the casts into their consumers (training,
under ``torch.compile``) removes: all where the weights are cast once, half where activations still convert."""


def recast_kernels(x: RuleInput) -> list[Proposal]:
    """Kernels launched inside ``aten::_to_copy``/``aten::to`` take a tenth of kernel time or more: name them, and
    cast once (an inference model stored in 16 bits) or fuse the casts into the kernels that read them."""
    k = x.report.kernels
    if not k.total_s or k.cast_kernel_s / k.total_s < CAST_SHARE:
        return []
    seconds = x.per_window_step(k.cast_kernel_s)
    dtype = amp_dtype(x.hw)
    evidence: dict[str, object] = {
        "cast_kernels_per_step": round(x.per_window_step(k.cast_kernel_count), 1),
        "cast_ms_per_step": _ms(seconds), "cast_share_of_kernel_time": round(k.cast_kernel_s / k.total_s, 3),
        "assumption": f"{CAST_KEPT[0]:.0%}–{CAST_KEPT[1]:.0%} of the casts' device time goes"}
    fix = (f"model = model.to(torch.{dtype}).eval()   # weights cast once, not at every forward under autocast\n"
           "with torch.inference_mode():                  # and no torch.autocast around the forward\n"
           "    out = model(batch.to(device, torch." + dtype + "))") if x.inference else (
        "model = torch.compile(model)   # fuses each cast into the kernel that reads it\n"
        "# one torch.autocast region around the whole forward: its cast cache lives per region, and every region\n"
        "# entered again (per layer, per micro-batch) casts the same fp32 weights again")
    return [x.rec(
        "recast_kernels", COMPUTE,
        f"Dtype casts take {k.cast_kernel_s / k.total_s:.0%} of the GPU's time "
        f"({x.per_window_step(k.cast_kernel_count):.0f} cast kernels a step): cast once, or fuse the casts",
        evidence, fix, removes_between(*CAST_KEPT, busy=seconds), confidence="medium",
    )]
