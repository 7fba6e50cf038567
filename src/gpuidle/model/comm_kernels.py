"""Communication kernels by family: which device kernels move data between GPUs, and what each does.

A family is recognised by the shape of its names, never by one build's namespace: DeepSeek's own DeepEP build
names its kernels ``dpsk::ep::internode::dispatch`` where the public one says ``deep_ep::internode::dispatch``, so
DeepEP is an ``ep`` namespace (with any prefix) whose kernels dispatch, combine or notify, or any namespace's
``intranode``/``internode``/``internode_ll`` dispatch and combine. ``tests/test_comm_kernels.py`` holds a table
of real names, each with its family and its collective, gathered from every trace the project holds.
"""

from __future__ import annotations

import functools
import re

FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nccl", re.compile(r"^nccl\w*kernel|^rccl\w*kernel|^ncclDevKernel|^ncclKernel", re.I)),
    ("msccl", re.compile(r"^msccl|mscclpp", re.I)),
    ("deepep", re.compile(
        r"(?:\bdeep_|\b)ep::(?:\w+::)*\w*(?:dispatch|combine|notify)"
        r"|\b(?:intranode|internode|internode_ll|low_latency)::\w*(?:dispatch|combine|notify)")),
    ("pplx", re.compile(r"\bpplx::")),
    ("nvshmem", re.compile(r"\bnvshmemi?_", re.I)),
    ("ucc", re.compile(r"\bucc_", re.I)),
    ("custom_all_reduce", re.compile(
        r"cross_device_reduce|custom_?all_?reduce|(one|two)_shot_all_reduce|multimem_(all_reduce|all_gather|reduce)",
        re.I)),
)
"""Each family with the names its kernels have: NCCL/RCCL, MSCCL and MSCCL++, DeepEP (any namespace), pplx's
expert dispatch and combine, NVSHMEM-based kernels, UCC's, the vendors' custom all-reduce (vLLM's, PyTorch's
symmetric-memory one- and two-shot and multimem kernels)."""

COLLECTIVE_KERNEL = tuple(pattern for _, pattern in FAMILIES)
"""Any family's kernel: a trace's distinct kernel names are searched with all of them at once
(:func:`gpuidle.model.name_search.found_any`)."""

_OPS = (
    (re.compile(r"all_?reduce|cross_device_reduce", re.I), "all_reduce"),
    (re.compile(r"all_?gather", re.I), "all_gather"),
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?to_?all", re.I), "all_to_all"),
    (re.compile(r"broadcast", re.I), "broadcast"),
    (re.compile(r"^reduce$|_reduce_|kernel_reduce", re.I), "reduce"),
    (re.compile(r"barrier", re.I), "barrier"),
    (re.compile(r"sendrecv|send|recv", re.I), "send_recv"),
)
_NCCL_OP = re.compile(r"(?:ncclKernel|ncclDevKernel)_([A-Za-z]+)")


@functools.lru_cache(maxsize=4096)
def comm_family(name: str) -> str | None:
    """The communication family of a kernel name, ``None`` for a kernel that computes."""
    for family, pattern in FAMILIES:
        if pattern.search(name):
            return family
    return None



@functools.lru_cache(maxsize=4096)
def kernel_collective(name: str) -> str:
    """What a communication kernel does, from its name alone: ``all_reduce``, ``all_to_all``... Expert dispatch and
    combine (DeepEP, pplx: their notify and layout kernels too) are all-to-all. NCCL's ``SendRecv`` kernel is
    ``send_recv``: an all-to-all and a pipeline's send/recv both run it, and only the host call that issued it
    tells which. The name itself where nothing fits."""
    family = comm_family(name)
    if family in ("deepep", "pplx"):
        return "all_to_all"
    op = _NCCL_OP.search(name)
    return canonical_op(op.group(1) if op else name)


@functools.lru_cache(maxsize=4096)
def canonical_op(name: str) -> str:
    """A collective's name (a host call's, or a kernel's operation) in one spelling (``all_reduce``,
    ``all_gather``...), the name itself where none fits. Cached: a trace names a few collectives many thousand
    times."""
    for pattern, canon in _OPS:
        if pattern.search(name):
            return canon
    return name or "unknown"
