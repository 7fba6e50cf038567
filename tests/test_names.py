"""Name classes: case-insensitive facts hold whatever the case of a name, and match as the patterns read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuidle.analysis.names import CONV, DATA_LOADING, ENGINE, FOLDED, GEMM, REDUCED_PRECISION, NameClasses


def test_folded_patterns_are_lowercase() -> None:
    """They are searched in lowercased names: an uppercase letter in one could never match."""
    for pattern in FOLDED:
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
def test_folded_patterns_match_as_ignorecase_on_real_names(data: Path, trace: str) -> None:
    """The reference: each pattern compiled with ``IGNORECASE`` and searched in the names as written."""
    from gpuidle.sources import kineto

    strings = kineto.read(str(data / trace)).strings
    classes = NameClasses.of(strings)
    facts = (("data_loading", DATA_LOADING), ("engine", ENGINE), ("gemm", GEMM), ("conv", CONV),
             ("reduced_precision", REDUCED_PRECISION))
    for field, pattern in facts:
        reference = re.compile(pattern.pattern, re.IGNORECASE)
        expected = [reference.search(s) is not None for s in strings]
        assert getattr(classes, field).tolist() == expected, field
    assert any(getattr(classes, field).any() for field, _ in facts)  # each trace holds names they match
