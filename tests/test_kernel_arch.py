"""The GPU family read from kernel names: each family's patterns match as its one pattern did."""

from __future__ import annotations

import re
from pathlib import Path

from gpuidle.sources.kernel_arch import FAMILIES, ORDER, family

ONE_PATTERN = {
    "maxwell": re.compile(r"^maxwell_"),
    "pascal": re.compile(r"^pascal_"),
    "volta": re.compile(r"^volta_|_volta_|^sm70_"),
    "turing": re.compile(r"^turing_|^sm75_"),
    "ampere": re.compile(r"^ampere_|^sm8[06]_|_sm8[06]_|cutlass_80_|_sm80\b"),
    "ada": re.compile(r"^sm89_|_sm89_"),
    "hopper": re.compile(r"^sm90a?_|_sm90a?_|wgmma|cutlass3x_sm90|_sm90\b"),
    "blackwell": re.compile(r"^sm10\d_|_sm10\d[af]?_|cutlass3x_sm10\d|tcgen05"),
    "cdna": re.compile(r"^Cijk_|^ck_|rocblas|miopen|MIOpen|hipblaslt", re.IGNORECASE),
    "cdna2": re.compile(r"gfx90a"),
    "cdna3": re.compile(r"gfx94[0-2]"),
}
"""The families as one pattern each, before each was split into the patterns ``re`` searches fast."""


def reference(kernel: str) -> str | None:
    found = [name for name, pattern in ONE_PATTERN.items() if pattern.search(kernel)]
    return max(found, key=lambda n: ORDER[n], default=None)


def test_every_family_is_checked() -> None:
    assert [name for name, _ in FAMILIES] == list(ONE_PATTERN)


def test_families_match_as_their_single_patterns(data: Path) -> None:
    from gpuidle.sources import kineto

    kernels = [s for t in ("negative_queue_length_values_check__rank0.json.gz",
                           "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                           "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
               for s in kineto.read(str(data / t)).strings]
    kernels += ["volta_sgemm_128x64_nn", "xvolta_sgemm", "cutlass_volta_x", "sm70_xmma", "turing_fp16_s1688gemm",
                "ampere_bf16_s16816gemm", "sm80_xmma_gemm", "sm86_x", "x_sm86_y", "cutlass_80_tensorop", "k_sm80",
                "k_sm80x", "sm89_xmma", "sm90_xmma_gemm", "sm90a_x", "x_sm90a_y", "x_wgmma_y", "cutlass3x_sm90_t",
                "k_sm90", "sm100_x", "x_sm100f_y", "cutlass3x_sm100_t", "tcgen05_mma", "Cijk_Ailk_Bljk_HHS_gfx942",
                "CIJK_x", "ck_fmha", "xck_fmha", "ROCBLAS_x", "MIOpen_conv", "miopenConv", "HipBlasLt_k", "x_gfx90a",
                "gfx943", "maxwell_sgemm", "pascal_hgemm", "", "Kernel_sm80", "sm80"]
    assert [family(k) for k in kernels] == [reference(k) for k in kernels]
    assert {family(k) for k in kernels} >= {"volta", "ampere", "hopper", "blackwell", "cdna3"}
