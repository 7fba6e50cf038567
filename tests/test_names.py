"""Name classes: case-insensitive facts hold whatever the case of a name, and match as the patterns read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuidle.analysis.names import (
    CONV,
    DATA_LOADING,
    ENGINE,
    FOLDED,
    GEMM,
    NOT_MATRIX_MATH,
    REDUCED_PRECISION,
    NameClasses,
)
from gpuidle.model import name_search


def test_folded_patterns_are_lowercase() -> None:
    """They are searched in lowercased names: an uppercase letter in one could never match."""
    for pattern in (p for fact in FOLDED for p in fact):
        literal = re.sub(r"\\.", "", pattern.pattern)  # escapes such as \b, \w are not letters to match
        assert literal == literal.lower(), pattern.pattern
        assert not pattern.flags & re.IGNORECASE


def test_case_does_not_matter_for_folded_facts() -> None:
    strings = [
        "volta_h884gemm_128x64_ldg8_nn",
        "VOLTA_H884GEMM_128X64_LDG8_NN",
        "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32",
        "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
        "IteratorGetNext",
        "DevicePut",
        "VLLM::attention",
        "aten::add_",
    ]
    classes = NameClasses.of(strings)
    assert classes.gemm.tolist() == [True, True, True, True, False, False, False, False, False]
    assert classes.reduced_precision.tolist() == [True, True, True, True, False, False, False, False, False]
    assert classes.conv.tolist() == [False, False, True, False, False, False, False, False, False]
    assert classes.data_loading.tolist() == [False, False, False, False, True, True, True, False, False]
    assert classes.engine.tolist() == [False] * 7 + [True, False]


def test_case_sensitive_facts_stay_case_sensitive() -> None:
    classes = NameClasses.of(["cudaStreamSynchronize", "CUDASTREAMSYNCHRONIZE", "ProfilerStep#3", "profilerstep#3"])
    assert classes.sync_call.tolist() == [True, False, False, False]
    assert classes.profiler_step.tolist() == [False, False, True, False]


@pytest.mark.parametrize("trace", ["negative_queue_length_values_check__rank0.json.gz",
                                   "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                   "h200_dataloader__before.pt.trace.json.gz"])
@pytest.mark.parametrize("join_from", [0, 1 << 30], ids=["joined", "one-by-one"])
def test_folded_patterns_match_as_ignorecase_on_real_names(data: Path, trace: str, join_from: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference: each pattern compiled with ``IGNORECASE`` and searched in the names as written."""
    monkeypatch.setattr(name_search, "JOIN_FROM", join_from)
    from gpuidle.sources import kineto

    strings = kineto.read(str(data / trace)).strings
    classes = NameClasses.of(strings)
    facts = (("data_loading", DATA_LOADING), ("engine", ENGINE), ("gemm", GEMM), ("conv", CONV),
             ("reduced_precision", REDUCED_PRECISION))
    not_math = [re.compile(p.pattern, re.IGNORECASE) for p in NOT_MATRIX_MATH]
    for field, fact in facts:
        references = [re.compile(p.pattern, re.IGNORECASE) for p in fact]
        expected = [any(r.search(s) for r in references) for s in strings]
        if field in ("gemm", "conv"):  # a matrix kernel's name, unless it names an elementwise one
            expected = [e and not any(r.search(s) for r in not_math) for e, s in zip(expected, strings, strict=True)]
        if field == "reduced_precision":  # told of GEMM and convolution names only (as written, elementwise too)
            matrix = [any(r.search(s) for r in [re.compile(p.pattern, re.IGNORECASE) for p in (*GEMM, *CONV)])
                      for s in strings]
            expected = [e and m for e, m in zip(expected, matrix, strict=True)]
        assert getattr(classes, field).tolist() == expected, field
    assert any(getattr(classes, field).any() for field, _ in facts)  # each trace holds names they match


ONE_PATTERN = {
    "sync_call": r"^(cuda|hip)(Stream|Device|Event|Ctx)Synchronize$|^cu(Stream|Ctx|Event)Synchronize$|^(cuda|hip)Free$"
                 r"|BlockHostUntilReady|block_until_ready|^TFE_TensorHandleResolve$|ToLiteral",
    "data_loading": r"dataloader|data[_ ]?load|load[_ ]?batch|get[_ ]?batch|iteratorgetnext|iterator::getnext"
                    r"|device_?put|\bgrain\b",
    "region": r"^ProfilerStep#|^Optimizer\.\w+#|^Torch-Compiled Region|^TorchDynamo|^## .* ##$|^CompiledFxGraph|"
              r"^DistributedDataParallel\.forward$|^FullyShardedDataParallel\.|^enumerate\(DataLoader\)",
    "zero_grad": r"^Optimizer\.zero_grad#|zero_grad$",
    "training_op": r"^autograd::engine::evaluate_function|Backward0?$|^Optimizer\.step#"
                   r"|^aten::_foreach_(add|mul|addcmul|lerp)_|^Optimizer\.zero_grad#|^optimizer\.step",
    "compiled": r"^Torch-Compiled Region|^CompiledFunction|^TorchDynamo|^CompiledFxGraph|^triton_|^inductor",
    "graph_launch": r"^(cuda|hip)GraphLaunch|^cuGraphLaunch",
    "launch_call": r"Launch|^(cuda|hip)Memset|^cuMemset|^cudaGraphLaunch|^hipGraphLaunch",
    "reduced_precision": r"884|1688|16816|16832|s16|h16|bf16|fp16|f16|half|bfloat|tensorop|_hmma|hgemm|\bh\w*gemm|e4m3"
                         r"|e5m2|fp8|hhs|bbs|_hb_|_bb_|_hh_",
}
"""Facts as one pattern each, the way they read before each was split into the patterns ``re`` searches fast."""
LOWERED = {"data_loading", "reduced_precision"}


def test_split_facts_match_as_their_single_patterns(data: Path) -> None:
    from gpuidle.sources import kineto

    traces = ("negative_queue_length_values_check__rank0.json.gz", "h200_dataloader__before.pt.trace.json.gz",
              "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    strings = [s for t in traces
               for s in kineto.read(str(data / t)).strings]
    strings += ["cudaStreamSynchronize", "xcudaStreamSynchronize", "cudaFree", "cudaFreeHost", "ToLiteral(x)",
                "TFE_TensorHandleResolve", "## forward ##", "## a ##b", "DistributedDataParallel.forward",
                "DistributedDataParallel.forward2", "zero_grad", "Optimizer.zero_grad#SGD.zero_grad", "MulBackward0",
                "MulBackward0x", "cudaGraphLaunch", "cuMemsetD32Async", "hipMemsetAsync", "a cudaMemset",
                "my grain loader", "grains", "volta_h884gemm", "x_hgemm", "ah16_gemm", "sm90_h_gemm", "fooh_gemm",
                "device_put", "DevicePut", "GRAIN", ""]
    classes = NameClasses.of(strings)
    for field, text in ONE_PATTERN.items():
        pattern = re.compile(text)
        names = [s.lower() for s in strings] if field in LOWERED else strings
        assert getattr(classes, field).tolist() == [pattern.search(s) is not None for s in names], field
