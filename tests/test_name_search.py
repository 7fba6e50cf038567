"""Patterns searched in all names at once give what a search of each name gives."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from gpuidle.analysis import names as name_classes
from gpuidle.analysis import startup
from gpuidle.model import name_search
from gpuidle.model.comm_kernels import COLLECTIVE_KERNEL
from gpuidle.model.name_search import JoinedNames, anchored, found_any, found_in
from gpuidle.sources.kernel_arch import FAMILIES
from gpuidle.sources.step_markers import ENGINE_ITERATION_NAME, PROFILER_STEP_NAME

FACTS = [p for fact in vars(name_classes).values() if isinstance(fact, tuple) and fact
         and all(isinstance(p, re.Pattern) for p in fact) for p in fact]
"""The name classes' patterns (:class:`gpuidle.analysis.names.NameClasses`)."""
STARTUP = [p for p in vars(startup).values() if isinstance(p, re.Pattern)]
PATTERNS = [*COLLECTIVE_KERNEL, PROFILER_STEP_NAME, ENGINE_ITERATION_NAME, *(p for _, ps in FAMILIES for p in ps),
            *FACTS, *STARTUP]
"""Every pattern searched through :mod:`gpuidle.model.name_search` (the readers' kernel and step patterns, the name
classes, one-time work's kinds)."""
PIECES = ["ncclDevKernel_AllReduce", "nccl", "kernel", "ProfilerStep#", "12", "sm90_", "_sm80", "wgmma", "Cijk_",
          "gfx942", "ucc_", "x", "", " ", "_", "#", "\n", "İ", "Σ", "é", "ampere_", "volta_", "::", "deep_ep::",
          "## ", "broad", "cast", "convert", "gemm", "h", "cudaMemcpy", "_v2", "Backward", "zero_grad", "grain",
          "Optimizer.step#", "Launch", "PjitFunction(", "/site-packages/", "MPI_Send", "bf16", "conv", "er",
          "ı", "ſ", "\u212a", "NCCL", "Kernel", "MULTIMEM_REDUCE", "ﬅ", "nvſhmem_", "UCC_", "deep_EP::",
          "two_ſhot_all_reduce", "croſs_devİce_reduce", "cuſtom_all_reduce", "rccl\u212aernel", "nvshmemı_",
          "DataLoader", "data_load", "IteratorGetNext", "device_put", "compil", "Compil", "nvrtc", "re", "ing",
          "ation", "c10d::", "cudaStreamSynchronize", "cudaFree", "aten::item", "Torch-Compiled Region", "triton_",
          "cuModuleLoad", "cudaGraphLaunch", "vllm", "eigenmetakernel", "bn_", "_norm_", "implicit_gemm", "fp16",
          "torch/", "<built-in", "$", "(", ")", ".py", "execute_model", "core step: ", "run_batch", "EngineCore.step",
          "sm70_", "sm75_", "sm86_", "ck_", "cijk_", "turing_", "maxwell_", "sm100_"]
"""Pieces of names: the patterns' literals, and characters ``re`` takes for an ASCII letter whatever the case
(``İ``, ``ı``, ``ſ``, the Kelvin sign) in them."""


@pytest.fixture(autouse=True)
def always_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every list joined, however short (traces' lists of a few hundred names are searched one by one)."""
    monkeypatch.setattr(name_search, "JOIN_FROM", 0)


def names(rng: random.Random, newlines: bool) -> list[str]:
    pieces = PIECES if newlines else [p for p in PIECES if p != "\n"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 60))]


def test_found_in_and_any_are_each_names_search() -> None:
    rng = random.Random(7)
    for case in range(600):
        batch = names(rng, newlines=case % 5 == 0)
        for pattern in PATTERNS:
            each = np.array([pattern.search(n) is not None for n in batch], bool)
            assert np.array_equal(found_in(batch, pattern), each), (pattern.pattern, batch)
            folded = [n.lower() for n in batch]
            assert JoinedNames(batch).any(pattern) == bool(each.any())
            assert JoinedNames([n.lower() for n in batch]).any(pattern) == any(pattern.search(n) for n in folded)
        families = np.array([any(p.search(n) for p in COLLECTIVE_KERNEL) for n in batch], bool)
        assert np.array_equal(found_any(batch, COLLECTIVE_KERNEL), families)


def test_a_name_holding_a_newline_is_its_own_name() -> None:
    """``^`` anchors at a name's start, not after a newline inside it."""
    pattern = re.compile(r"^ncclKernel")
    assert found_in(["x\nncclKernel", "ncclKernel"], pattern).tolist() == [False, True]
    assert not JoinedNames(["x\nncclKernel"]).any(pattern)
    assert found_in([], pattern).size == 0


def test_hand_made_patterns_split_and_word_led_search_as_written() -> None:
    """Anchored alternatives apart from the others, ``\\bword`` led by its word: the same names found."""
    rng = random.Random(11)
    patterns = [re.compile(p, f) for p, f in (
        (r"\bab?c|^x\w*y|\bq{2}|z", 0), (r"\bnvshmemi?_|^ncclKernel|ucc_", re.I), (r"\b(a|b)c|^(d)\1", 0),
        (r"\b_x+|\b\d|\bé", 0), (r"^a|^b", 0), (r"\bkernel", re.I), (r"(?:\bdeep_|\b)ep::\w*dispatch|^m", 0),
        (r"^(a|b)c|(x|y)+z|(?:q|\bd)d|(?:(a|b)|c)?y", 0), (r"(?i:a|b)c|(?=x)y|(?<!q)qq|(one|two)_x", 0),
        (r"\b(?:one|two|o)::x|\b(a|b)+c", re.I), (r"^((a|b)(c|d)q|y(one|two)|\dnc)$", 0), (r"\w_x|\dd|a\.b", 0),
        (r"^ab?c|^a\ b|^\(x|^qq+z", re.I), (r"^(?:one|two)\.|^[ab]c|^m$", 0),
        # the joined text is not a name: its edges (\A, \Z, \B), a newline, codes that lowercasing leaves as they
        # are, ranges that take in more lowercased, case-sensitive groups, named groups and conditionals
        (r"^[a]\Z", 0), (r"^a|^\Ab", 0), (r"^\B", 0), (r"^\x41", re.I), (r"\x41b", re.I), (r"(?-i:A)b", re.I),
        (r"x[@-Z]", re.I), (r"^(?=\n)|^q", 0), (r"^((a|b)(?P<n>c)|d)", 0), (r"^(a)?(?(1)b|c)", 0))]
    pieces = ["a", "b", "c", "x", "y", "q", "qq", "z", "_", " ", ".", "(", "@", "nvshmem", "NVSHMEMI_", "ncclKernel",
              "Ucc_", "d", "dd", "1", "é", "Kernel", "deep_ep::", "ep::", "dispatch", "m", "\n", "ı", "İ", "one", "two",
              "A", "B"]
    for _ in range(400):
        batch = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(0, 30))]
        for pattern in patterns:
            each = [pattern.search(n) is not None for n in batch]
            assert found_in(batch, pattern).tolist() == each, (pattern.pattern, batch)
            assert JoinedNames(batch).any(pattern) == any(each)


def test_a_pattern_anchored_in_every_alternative_is_told_apart() -> None:
    assert anchored(re.compile(r"^(a|b)c|^d"))
    assert anchored(re.compile(r"^[|(]x|^\|"))
    assert not anchored(re.compile(r"^a|b"))
    assert not anchored(re.compile(r"^[]|]|b"))
    assert not anchored(re.compile(r"(^a)|^b"))
    assert not anchored(re.compile(r"^a\\|b"))


@pytest.mark.parametrize(("alternative", "lead"), [
    (r"^volta_", "volta_"), (r"\bkernel", "kernel"), (r"gemm(?<=\bgemm)", "gemm"), (r"ab?c", "a"), (r"ab+c", "ab"),
    (r"a\.b\ c", "a.b c"), (r"x{2}y", ""), (r"\dcudnn", ""), (r"[ab]c", ""), (r"(?:a|b)", ""), (r"abc$", "abc"),
    (r"a\nb", "a"), (r"ab*", "a"), ("", ""),
])
def test_the_lead_is_what_every_match_starts_with(alternative: str, lead: str) -> None:
    assert name_search._lead(alternative) == lead


def test_a_pattern_whose_leads_are_absent_is_not_searched() -> None:
    """Where none of the leads is in the names the answer is no before ``re`` runs; a lead present is searched."""
    pattern = re.compile(r"^volta_|sm70_(?<=\bsm70_)|Cijk_", re.I)
    assert name_search._required(pattern) == ("volta_", "sm70_", "cijk_")
    assert name_search._required(re.compile(r"volta_|[ab]x")) is None
    assert name_search._required(re.compile(r"^fread$|^read$|^pread64$|^pread$|x")) == ("read", "x")
    assert name_search._required(re.compile(r"^NCCL|nccl_kernel|^RCCL", re.I)) == ("nccl", "rccl")
    absent, present = JoinedNames(["ampere_x", "sm80_y"]), JoinedNames(["ampere_x", "VOLTA_y", "a SM70_b", "xcijk_"])
    assert absent._excluded(pattern)
    assert not present._excluded(pattern)
    assert not absent.found(pattern).any()
    assert present.found(pattern).tolist() == [False, True, True, True]
