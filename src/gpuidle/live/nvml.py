"""NVML, the one door to the NVIDIA driver: lazy init, explicit N/A, one batched sample.

This is the only module that imports ``pynvml`` (nvidia-ml-py); ruff's banned-api rule
keeps it so. Every query goes through :func:`query`, which turns a failed, unsupported
or missing call into :data:`NA` instead of an exception, so one GPU without NVLink or
an old driver without a function costs a column, never the whole sample.

Units follow the driver and are converted once, here: memory in MiB, power in W,
clocks in MHz, throughput in MiB/s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

from gpuidle.errors import GpuidleError
from gpuidle.model import GpuInfo, GpuSample

log = logging.getLogger(__name__)

MIB = 1 << 20
SCOPE_ALL_LINKS = 0xFFFFFFFF
"""NVML field scope that sums a per-link NVLink counter over all links."""
PCIE_LEGACY_MIN_INTERVAL_S = 1.0
"""``nvmlDeviceGetPcieThroughput`` blocks ~20 ms per call; ask it at most this often per device."""


class NaType:
    """"Not available": a failed or unsupported query. Falsy; prints ``N/A``; one instance."""

    _instance: NaType | None = None

    def __new__(cls) -> NaType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "N/A"

    __str__ = __repr__


NA: Final = NaType()


class NvmlUnavailable(GpuidleError):
    """NVML cannot start: no driver, no library, no GPU, or nvidia-ml-py missing."""


_lock = threading.Lock()
_lib: ModuleType | None = None
_init_error: str | None = None
_reported: set[str] = set()


def _pynvml() -> ModuleType:
    try:
        import pynvml  # type: ignore[import-untyped]  # noqa: TID251 -- this module is the one allowed importer
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed", "pip install 'gpuidle[nvml]'") from None
    mod: ModuleType = pynvml
    return mod


def init() -> ModuleType:
    """Start NVML once per process; later calls return at once (or raise the same error again)."""
    global _lib, _init_error
    with _lock:
        if _lib is not None:
            return _lib
        if _init_error is not None:
            raise NvmlUnavailable(_init_error)
        lib = _pynvml()
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            _init_error = f"NVML is unavailable: {err} (no NVIDIA driver or GPU on this machine?)"
            raise NvmlUnavailable(_init_error) from None
        except OSError as err:
            _init_error = f"NVML is unavailable: {err}"
            raise NvmlUnavailable(_init_error) from None
        _lib = lib
        return lib


def shutdown() -> None:
    global _lib
    with _lock:
        if _lib is not None:
            with contextlib.suppress(Exception):  # shutting down: nothing left to save
                _lib.nvmlShutdown()
            _lib = None


def _report_once(name: str, why: str) -> None:
    if name not in _reported:
        _reported.add(name)
        log.info("NVML %s: %s; reported as N/A", name, why)


def query(name: str, *args: Any) -> Any:
    """Call ``pynvml.<name>(*args)``; any failure is :data:`NA`. Bytes come back as str."""
    return _call(name, *args)[0]


def _call(name: str, *args: Any) -> tuple[Any, bool]:
    """:func:`query`, and whether a failure means "never supported" (not a passing error)."""
    lib = init()
    fn = getattr(lib, name, None)
    if fn is None:
        _report_once(name, "not in this nvidia-ml-py")
        return NA, True
    try:
        value = fn(*args)
    except lib.NVMLError as err:
        code = getattr(err, "value", None)
        if code == lib.NVML_ERROR_FUNCTION_NOT_FOUND:
            _report_once(name, "not in this driver")
        return NA, code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND)
    except Exception as err:  # a binding bug or version mismatch: one column, not the sample
        _report_once(name, f"{type(err).__name__}: {err}")
        return NA, True
    return (value.decode(errors="replace") if isinstance(value, bytes) else value), False


def _num(value: Any, scale: float = 1.0) -> float | None:
    return None if value is NA or value is None else float(value) * scale


_FIELD_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    fields: list[tuple[int, int]]
    """Counter fields this device answers: (field id, scope)."""
    last: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Field id -> (time, cumulative value) at the previous sample."""
    pcie_legacy: bool = False
    pcie_legacy_at: float = float("-inf")
    unsupported: set[tuple[Any, ...]] = field(default_factory=set)


class NvmlBackend:
    """Every device through NVML; one :meth:`sample` call is one consistent snapshot of all of them.

    Throughput comes from cumulative counters (PCIe bytes, NVLink KiB over all links)
    divided by the time between samples, so the first sample has none.
    """

    name = "nvml"

    def __init__(self, processes: bool = True) -> None:
        self.processes = processes
        self._devices: list[_Device] = []
        self._fid: dict[str, int] = {}

    def open(self) -> list[GpuInfo]:
        lib = init()
        count = query("nvmlDeviceGetCount")
        if count is NA or count == 0:
            raise NvmlUnavailable("NVML sees no GPU on this machine")
        self._fid = {
            "pcie_tx": getattr(lib, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197),
            "pcie_rx": getattr(lib, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198),
            "nvlink_tx": getattr(lib, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
            "nvlink_rx": getattr(lib, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139),
        }
        infos = []
        for i in range(int(count)):
            handle = query("nvmlDeviceGetHandleByIndex", i)
            if handle is NA:
                continue
            mem = query("nvmlDeviceGetMemoryInfo", handle)
            infos.append(GpuInfo(
                index=i, name=query("nvmlDeviceGetName", handle) or None,
                uuid=query("nvmlDeviceGetUUID", handle) or None,
                mem_total_mib=None if mem is NA else mem.total / MIB,
            ))
            dev = _Device(index=i, handle=handle, fields=[])
            dev.fields = self._probe_fields(handle)
            dev.pcie_legacy = not any(f == self._fid["pcie_rx"] for f, _ in dev.fields)
            self._devices.append(dev)
        return infos

    def _probe_fields(self, handle: Any) -> list[tuple[int, int]]:
        """The counter fields this device supports, found once so each sample asks only for those."""
        wanted = [(self._fid["pcie_tx"], 0), (self._fid["pcie_rx"], 0),
                  (self._fid["nvlink_tx"], SCOPE_ALL_LINKS), (self._fid["nvlink_rx"], SCOPE_ALL_LINKS)]
        values = query("nvmlDeviceGetFieldValues", handle, wanted)
        if values is NA:
            return []
        return [w for w, v in zip(wanted, values, strict=True) if v.nvmlReturn == 0]

    def close(self) -> None:
        self._devices = []
        shutdown()

    def sample(self, t: float) -> list[GpuSample]:
        lib = init()
        return [self._sample_device(lib, d, t) for d in self._devices]

    def _q(self, d: _Device, name: str, *args: Any) -> Any:
        """:func:`query`, skipping calls this device already said it does not support."""
        key = (name, *args)
        if key in d.unsupported:
            return NA
        value, never = _call(name, d.handle, *args)
        if never:
            d.unsupported.add(key)
        return value

    def _sample_device(self, lib: ModuleType, d: _Device, t: float) -> GpuSample:
        util = self._q(d, "nvmlDeviceGetUtilizationRates")
        mem = self._q(d, "nvmlDeviceGetMemoryInfo")
        reasons = self._q(d, "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is NA:
            reasons = self._q(d, "nvmlDeviceGetCurrentClocksThrottleReasons")
        s = GpuSample(
            index=d.index,
            util_pct=None if util is NA else float(util.gpu),
            mem_util_pct=None if util is NA else float(util.memory),
            mem_used_mib=None if mem is NA else mem.used / MIB,
            mem_total_mib=None if mem is NA else mem.total / MIB,
            sm_clock_mhz=_num(self._q(d, "nvmlDeviceGetClockInfo", lib.NVML_CLOCK_SM)),
            mem_clock_mhz=_num(self._q(d, "nvmlDeviceGetClockInfo", lib.NVML_CLOCK_MEM)),
            power_w=_num(self._q(d, "nvmlDeviceGetPowerUsage"), 1e-3),
            power_limit_w=_num(self._q(d, "nvmlDeviceGetEnforcedPowerLimit"), 1e-3),
            temp_c=_num(self._q(d, "nvmlDeviceGetTemperature", lib.NVML_TEMPERATURE_GPU)),
            throttle_reasons=None if reasons is NA else int(reasons),
        )
        rates = self._counter_rates(d, t)
        s.pcie_tx_mib_s = rates.get(self._fid["pcie_tx"])
        s.pcie_rx_mib_s = rates.get(self._fid["pcie_rx"])
        s.nvlink_tx_mib_s = rates.get(self._fid["nvlink_tx"])
        s.nvlink_rx_mib_s = rates.get(self._fid["nvlink_rx"])
        if d.pcie_legacy and t - d.pcie_legacy_at >= PCIE_LEGACY_MIN_INTERVAL_S:
            d.pcie_legacy_at = t
            s.pcie_tx_mib_s = _num(self._q(d, "nvmlDeviceGetPcieThroughput", lib.NVML_PCIE_UTIL_TX_BYTES), 1 / 1024)
            s.pcie_rx_mib_s = _num(self._q(d, "nvmlDeviceGetPcieThroughput", lib.NVML_PCIE_UTIL_RX_BYTES), 1 / 1024)
        if self.processes:
            procs = self._q(d, "nvmlDeviceGetComputeRunningProcesses")
            if procs is NA:  # an older driver without the _v3 call the unversioned name maps to
                procs = self._q(d, "nvmlDeviceGetComputeRunningProcesses_v2")
            s.pids = None if procs is NA else sorted({int(p.pid) for p in procs})
        return s

    def _counter_rates(self, d: _Device, t: float) -> dict[int, float]:
        """MiB/s per counter field since the previous sample (PCIe counts bytes, NVLink KiB)."""
        if not d.fields:
            return {}
        values = query("nvmlDeviceGetFieldValues", d.handle, d.fields)
        if values is NA:
            return {}
        out: dict[int, float] = {}
        for v in values:
            if v.nvmlReturn != 0:
                continue
            fid = int(v.fieldId)
            raw = float(getattr(v.value, _FIELD_ATTR.get(int(v.valueType), "ullVal")))
            unit = 1024.0 if fid in (self._fid["nvlink_tx"], self._fid["nvlink_rx"]) else 1.0
            prev = d.last.get(fid)
            d.last[fid] = (t, raw)
            if prev is not None and t > prev[0] and raw >= prev[1]:
                out[fid] = (raw - prev[1]) * unit / MIB / (t - prev[0])
        return out


def driver_version() -> str | None:
    v = query("nvmlSystemGetDriverVersion")
    return None if v is NA else str(v)
