"""The GPU family a trace's kernels were built for, read from their names.

Vendor libraries name kernels after the architecture they target: cuBLAS/cuDNN's
``volta_sgemm_128x64_nn``, ``turing_fp16_s1688gemm``, ``ampere_bf16_s16816gemm``,
cuBLASLt/CUTLASS ``sm80_xmma_gemm``, ``sm90_xmma``/``wgmma``, ROCm's Tensile ``Cijk_…``
with ``gfx90a``/``gfx942`` code objects. A kernel built for a family runs on it or a
later one, so the newest family named is the least the device can be; a trace without
``deviceProperties`` still tells a V100 from a GPU without tensor cores this way.
"""

from __future__ import annotations

import re

from gpuidle.model import DeviceOpKind, DeviceOps
from gpuidle.model.arrays import distinct
from gpuidle.model.name_search import JoinedNames

FAMILIES: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("maxwell", (re.compile(r"^maxwell_"),)),
    ("pascal", (re.compile(r"^pascal_"),)),
    ("volta", (re.compile(r"^volta_|^sm70_"), re.compile(r"_volta_"))),
    ("turing", (re.compile(r"^turing_|^sm75_"),)),
    ("ampere", (re.compile(r"^ampere_|^sm8[06]_"), re.compile(r"_sm8[06]_|cutlass_80_|_sm80\b"))),
    ("ada", (re.compile(r"^sm89_"), re.compile(r"_sm89_"))),
    ("hopper", (re.compile(r"^sm90a?_"), re.compile(r"_sm90a?_|wgmma|cutlass3x_sm90|_sm90\b"))),
    ("blackwell", (re.compile(r"^sm10\d_"), re.compile(r"_sm10\d[af]?_|cutlass3x_sm10\d|tcgen05"))),
    ("cdna", (re.compile(r"^cijk_|^ck_"), re.compile(r"rocblas|miopen|hipblaslt"))),
    ("cdna2", (re.compile(r"gfx90a"),)),
    ("cdna3", (re.compile(r"gfx94[0-2]"),)),
)
"""In order of age within a vendor: the last family found on a device wins. ``cdna`` (a ROCm library named,
no architecture) comes before the gfx targets, so that a Tensile ``Cijk_…_gfx942`` kernel reads as CDNA3. A
family is named where any of its patterns is found; ``cdna``'s, whatever the case (searched in the lowercased
name). Anchored and unanchored alternatives are apart, each pattern led by literals, as ``re`` searches fastest
(``analysis.names`` says why)."""
FOLDED = frozenset({"cdna"})
ORDER = {name: i for i, (name, _) in enumerate(FAMILIES)}


def family(kernel: str) -> str | None:
    """The newest family a kernel name claims, or None."""
    lowered = kernel.lower()
    found = [name for name, patterns in FAMILIES
             if any(p.search(lowered if name in FOLDED else kernel) for p in patterns)]
    return max(found, key=lambda n: ORDER[n], default=None)


def kernel_arch_by_device(strings: list[str], ops: DeviceOps) -> dict[int, str]:
    """Per device, the newest family among its kernels' names (distinct names only): each family's patterns
    searched once in all of a device's names (:mod:`.name_search`), the newest claimed as the newest of each
    name's newest would be; a ROCm family before any other."""
    out: dict[int, str] = {}
    kernels = ops.kind == DeviceOpKind.KERNEL
    for d in distinct(ops.device[kernels]):
        names = [strings[n] for n in distinct(ops.name[kernels & (ops.device == d)]).tolist()]
        joined, lowered = JoinedNames(names), JoinedNames([n.lower() for n in names])
        found = [name for name, patterns in FAMILIES
                 if any((lowered if name in FOLDED else joined).any(p) for p in patterns)]
        cdna = [f for f in found if f.startswith("cdna")]
        best = max(cdna or found, key=lambda n: ORDER[n], default=None)
        if best is not None:
            out[int(d)] = best
    return out
