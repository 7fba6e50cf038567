"""Precision fixes from kernel names: TF32 first on Ampere and later where fp32 GEMMs run on the SIMT cores, 16-bit
autocast as its alternative on the same time (never added to it); neither where the GEMMs already use the matrix
units; no TF32 on a device without it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuidle.advice.precision import AMP_SPEEDUP_HIGH, AMP_SPEEDUP_LOW, TF32_SPEEDUP_HIGH, TF32_SPEEDUP_LOW
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport
from minitrace import Trace

SIMT = "ampere_sgemm_128x64_tn"
TF32 = "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4"


def gemm_job(tmp_path: Path, kernel: str, capability: tuple[int, int], name: str) -> AnalysisReport:
    """Four 10 ms steps, each 8 ms of ``kernel`` (1 ms per launch) and 0.5 ms of an elementwise kernel."""
    t = Trace()
    for i in range(4):
        at = i * 10_000.0
        t.step(i, at, 10_000)
        for j in range(8):
            t.launch(at=at + 10 + j * 20, call_dur=5, start=at + 200 + j * 1000, dur=1000, name=kernel)
        t.launch(at=at + 200, call_dur=5, start=at + 8300, dur=500,
                 name="void at::native::vectorized_elementwise_kernel<4, float>(int)")
    doc = t.to_dict()
    doc["deviceProperties"] = [{"id": 0, "name": name, "computeMajor": capability[0], "computeMinor": capability[1]}]
    path = tmp_path / f"{name.replace(' ', '_')}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return analyze([path])


def test_tf32_first_on_ampere_with_autocast_its_alternative(tmp_path: Path) -> None:
    report = gemm_job(tmp_path, SIMT, (8, 0), "NVIDIA A100-SXM4-80GB")
    recs = {r.id: r for r in report.recommendations}
    tf32, amp = recs["tf32"], recs["mixed_precision"]
    fp32_ms = 8.0  # per step, every step steady
    assert tf32.evidence["fp32_gemm_ms_per_step"] == pytest.approx(fp32_ms)
    assert tf32.gain.step_s_saved_low == pytest.approx(fp32_ms * (1 - 1 / TF32_SPEEDUP_LOW) / 1e3, rel=1e-6)
    assert tf32.gain.step_s_saved_high == pytest.approx(fp32_ms * (1 - 1 / TF32_SPEEDUP_HIGH) / 1e3, rel=1e-6)
    assert amp.gain.step_s_saved_low == pytest.approx(fp32_ms * (1 - 1 / AMP_SPEEDUP_LOW) / 1e3, rel=1e-6)
    assert amp.gain.step_s_saved_high == pytest.approx(fp32_ms * (1 - 1 / AMP_SPEEDUP_HIGH) / 1e3, rel=1e-6)
    ids = [r.id for r in report.recommendations]
    assert ids.index("tf32") < ids.index("mixed_precision")
    assert amp.alternative_to == "tf32"  # one pool of fp32 GEMM time: never both counted
    assert 'set_float32_matmul_precision("high")' in tf32.fix
    assert "TF32" in tf32.title


def test_no_tf32_before_ampere(tmp_path: Path) -> None:
    report = gemm_job(tmp_path, "volta_sgemm_128x64_nn", (7, 0), "Tesla V100-SXM2-16GB")
    ids = [r.id for r in report.recommendations]
    assert "tf32" not in ids
    (amp,) = [r for r in report.recommendations if r.id == "mixed_precision"]
    assert amp.alternative_to is None
    assert "GradScaler" in amp.fix  # no bf16 on sm_70


def test_gemms_already_on_the_tensor_cores_get_no_precision_fix(tmp_path: Path) -> None:
    report = gemm_job(tmp_path, TF32, (8, 0), "NVIDIA A100-SXM4-80GB")
    assert not {"tf32", "mixed_precision"} & {r.id for r in report.recommendations}
    assert report.ranks[0].kernels.reduced_precision_gemm_share == pytest.approx(1.0)


def test_recast_kernels_are_named_and_cast_once_for_inference(tmp_path: Path) -> None:
    """An inference forward under autocast: each step's GEMM reads weights re-cast by a copy kernel launched inside
    ``aten::_to_copy`` (300 µs of 1,000 µs of kernels): the casts are named, and an inference model is cast once."""
    t = Trace()
    for n, base in enumerate((0, 2000, 4000, 6000), start=1):
        t.step(n, base, 2000)
        t.op("aten::linear", base, 40)
        t.op("aten::_to_copy", base + 1, 20)
        t.launch(at=base + 5, call_dur=5, start=base + 10, dur=300,
                 name="void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)")
        t.launch(at=base + 30, call_dur=5, start=base + 310, dur=700, name="ampere_bf16_s16816gemm_bf16_128x64_tn")
    report = analyze([t.write(tmp_path / "t.json.gz")])
    (fix,) = [r for r in report.recommendations if r.id == "recast_kernels"]
    assert fix.evidence["cast_kernels_per_step"] == 1.0
    assert fix.evidence["cast_share_of_kernel_time"] == pytest.approx(0.3)
    assert fix.title.startswith("Dtype casts take 30% of the GPU's time (1 cast kernels a step)")
    assert ".eval()" in fix.fix
    assert fix.gain.step_s_saved_low == pytest.approx(150e-6)
    assert fix.gain.step_s_saved_high == pytest.approx(300e-6)
