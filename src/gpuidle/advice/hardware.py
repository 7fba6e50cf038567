"""Which fix applies where: the one table of device generations and what they support.

A device is known by its name and compute capability (Kineto ``deviceProperties``, the
tracker's ``torch.cuda.get_device_capability``), else by the family its kernels were built
for (``volta_*`` kernels run on sm_70 or later: fp16 tensor cores), else not at all: then
no claim is made either way. bf16 autocast pays only where the
matrix units do bf16: NVIDIA sm >= 80 (Ampere, Hopper, Blackwell), AMD CDNA2/CDNA3
(MI200, MI300). Below, fp16 with ``torch.amp.GradScaler``; without tensor cores (sm < 70)
no tensor-core speed-up is claimed. Host-timed runs make no device claim at all.
"""

from __future__ import annotations

import re

import msgspec

from gpuidle.model import DeviceReport

CUDA, ROCM, HOST, UNKNOWN = "cuda", "rocm", "host", "unknown"
_AMD = re.compile(r"\bAMD\b|Radeon|Instinct|\bMI\d{3}", re.I)
_CDNA2_PLUS = re.compile(r"\bMI[23]\d{2}", re.I)


class Hardware(msgspec.Struct, frozen=True):
    platform: str
    """``cuda``, ``rocm``, ``host`` (host-timed, no device) or ``unknown``."""
    name: str | None
    capability: tuple[int, int] | None
    from_kernels: str | None = None
    """The kernel-name family the capability was inferred from (a lower bound), when no property said."""

    @property
    def bf16(self) -> bool:
        """bf16 autocast runs on the matrix units."""
        if self.platform == CUDA:
            return self.capability is not None and self.capability >= (8, 0)
        if self.platform == ROCM:
            return bool(self.name and _CDNA2_PLUS.search(self.name)) or (
                self.capability is not None and self.capability[0] >= 9)
        return False

    @property
    def tensor_cores(self) -> bool | None:
        """fp16 matrix units present; None: not known (no capability recorded, or no device known)."""
        if self.platform == CUDA:
            return None if self.capability is None else self.capability >= (7, 0)
        if self.platform == ROCM:
            return None if self.capability is None and not (self.name and _CDNA2_PLUS.search(self.name)) else True
        return False if self.platform == HOST else None

    @property
    def matrix_units(self) -> str:
        """The vendor's word: NVIDIA's tensor cores, AMD's matrix cores."""
        return "matrix cores" if self.platform == ROCM else "tensor cores"

    @property
    def conv_library(self) -> str:
        """The convolution library ``torch.backends.cudnn`` drives: cuDNN, or MIOpen on ROCm builds."""
        return "MIOpen" if self.platform == ROCM else "cuDNN"

    @property
    def smi(self) -> str | None:
        """The vendor's counter tool, or None where no device was measured."""
        return {CUDA: "nvidia-smi", ROCM: "rocm-smi"}.get(self.platform)

    @property
    def label(self) -> str:
        sm = f"sm_{self.capability[0]}{self.capability[1]}" if self.capability and self.platform == CUDA else None
        if self.from_kernels is not None and sm is not None:
            sm = f"{sm}+ ({self.from_kernels} kernels)"
        elif self.from_kernels is not None:
            sm = f"{self.from_kernels} kernels"
        if self.platform == UNKNOWN:
            return "hardware unknown"
        return ", ".join(x for x in (self.name, sm) if x) or self.platform


_BY_NAME = [
    (re.compile(r"\bK80\b|\bK40\b"), (3, 7)), (re.compile(r"\bP100\b"), (6, 0)),
    (re.compile(r"\bP40\b|\bP4\b"), (6, 1)),
    (re.compile(r"\bV100\b|TITAN V"), (7, 0)), (re.compile(r"\bT4\b|RTX 20\d\d"), (7, 5)),
    (re.compile(r"\bA100\b|\bA30\b"), (8, 0)), (re.compile(r"\bA10G?\b|\bA40\b|RTX 30\d\d|\bA6000\b"), (8, 6)),
    (re.compile(r"\bL4\b|\bL40S?\b|RTX 40\d\d"), (8, 9)), (re.compile(r"\bH100\b|\bH200\b|\bGH200\b"), (9, 0)),
    (re.compile(r"\bB200\b|\bGB200\b|\bB100\b"), (10, 0)),
]
"""NVIDIA names -> compute capability, for traces whose ``deviceProperties`` lack ``computeMajor``."""


FAMILY_CAPABILITY = {"maxwell": (5, 0), "pascal": (6, 0), "volta": (7, 0), "turing": (7, 5), "ampere": (8, 0),
                     "ada": (8, 9), "hopper": (9, 0), "blackwell": (10, 0)}
"""A kernel built for a family runs there or later: the least compute capability it implies."""
AMD_FAMILIES = {"cdna": None, "cdna2": (9, 0), "cdna3": (9, 4)}
"""ROCm families from kernel names (Tensile ``Cijk_``, ``gfx90a``, ``gfx942``); gfx9 is ``9.x``."""


def hardware(d: DeviceReport) -> Hardware:
    if d.timing == "host":
        return Hardware(HOST, None, None)
    cap = None
    if d.compute_capability:
        major, _, minor = d.compute_capability.partition(".")
        if major.isdigit() and minor.isdigit():
            cap = (int(major), int(minor))
    family = d.kernel_arch
    if (d.name and _AMD.search(d.name)) or family in AMD_FAMILIES:
        from_kernels = family if cap is None and family in AMD_FAMILIES else None
        return Hardware(ROCM, d.name, cap if cap is not None or family is None else AMD_FAMILIES.get(family),
                        from_kernels)
    if cap is None and d.name:
        cap = next((c for pattern, c in _BY_NAME if pattern.search(d.name)), None)
    if cap is None and family in FAMILY_CAPABILITY:
        return Hardware(CUDA, d.name, FAMILY_CAPABILITY[family], family)
    return Hardware(CUDA if (d.name or cap) else UNKNOWN, d.name, cap)


def amp_dtype(hw: Hardware) -> str:
    """The 16-bit type the device's matrix units take: bfloat16 where they have it (or the device is unknown)."""
    return "bfloat16" if hw.bf16 or hw.platform == UNKNOWN else "float16"


def amp_snippet(hw: Hardware, inference: bool = False) -> str:
    """The autocast fix that fits the device; for inference, no scaler and no backward."""
    dtype = amp_dtype(hw)
    if inference:
        return (f"with torch.inference_mode(), torch.autocast(device_type=\"cuda\", dtype=torch.{dtype}):   # "
                f"{hw.label}\n"
                "    out = model(x)\n"
                f"# or convert once: model = model.to(torch.{dtype})")
    if hw.bf16:
        return ("with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):   # "
                f"{hw.label}: bf16 matrix units, no scaler needed\n"
                "    loss = model(x, y)\n"
                "loss.backward()\n"
                "optimizer.step()")
    return ("scaler = torch.amp.GradScaler(\"cuda\")                 # "
            f"{hw.label}: no bf16 matrix units, fp16 with loss scaling\n"
            "with torch.autocast(device_type=\"cuda\", dtype=torch.float16):\n"
            "    loss = model(x, y)\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()")
