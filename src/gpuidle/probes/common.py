"""What the probes share: the lazy torch import, machine facts."""

from __future__ import annotations

import os
from types import ModuleType

from gpuidle.errors import GpuidleError

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

GUIDE_LATENCY_S = 1e-3
"""The guide's rule of thumb: small-message latency between nodes under 1 ms."""
GUIDE_BANDWIDTH_GBPS = 10 / 8
"""The guide's rule of thumb: more than 10 Gbit/s, i.e. 1.25 GB/s (bandwidths here are GB/s)."""

TORCH_HINT = "install PyTorch first (CPU or CUDA build, see pytorch.org), or pip install 'gpuidle[torch]'"


def import_torch() -> ModuleType:
    """torch, or a clear error: torch is an optional extra, needed only by the probes."""
    try:
        import torch
    except ImportError:
        raise GpuidleError("this probe needs PyTorch, which is not installed", TORCH_HINT) from None
    return torch


def import_dist() -> ModuleType:
    import_torch()
    import torch.distributed as dist

    if not dist.is_available():
        raise GpuidleError("this PyTorch build has no torch.distributed", TORCH_HINT)
    return dist


def ram_bytes() -> tuple[int | None, int | None]:
    """``(total, available)`` physical memory in bytes; None where the OS will not say."""
    total = avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    value = int(rest.split()[0]) * KIB
                    if key == "MemTotal":
                        total = value
                    else:
                        avail = value
    except (OSError, ValueError, IndexError):
        pass
    if total is None or avail is None:
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total = total or page * os.sysconf("SC_PHYS_PAGES")
            avail = avail or page * os.sysconf("SC_AVPHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            pass
    return total, avail


def human_bytes(n: int) -> str:
    """``8 B``, ``64 KiB``, ``1 GiB``: message sizes as nccl-tests users read them."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"
