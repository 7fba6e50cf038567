"""A stand-in for pynvml: two "Fake GPU"s with fixed readings, for the NVML layer without a GPU.

Tests put :func:`fake_pynvml` in ``sys.modules``; run as a script, it does the same and
then runs the ``gpuidle`` command line, so a test can start a real ``gpuidle monitor``
process (with its exporter) on a machine without a GPU::

    python tests/fake_pynvml.py monitor --prometheus-port 9400

Readings per device ``h`` (0 or 1): utilization.gpu ``90 + h`` %, utilization.memory 40 %,
``h + 1`` GiB used of 16 GiB, SM clock 1410 MHz, memory clock 1593 MHz, power 250 W (device
1: a passing error, so no value), limit 400 W, 60 °C; UUID ``GPU-h``.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

MIB = 1 << 20


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {12: "NVML Shared Library Not Found"}.get(self.value, f"error {self.value}")


def fake_pynvml(init_error: int | None = None) -> SimpleNamespace:
    calls: dict[str, int] = {}
    counters = {0: {197: 0.0, 198: 0.0, 138: 0.0, 139: 0.0}}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return fn(*args)
        return wrapper

    def init() -> None:
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def not_supported(h: int) -> int:
        if h == 1:
            raise FakeNVMLError(3)
        return 0x4

    def power(h: int) -> int:
        if h == 1:
            raise FakeNVMLError(999)  # a passing error: asked again next time
        return 250_000

    def fields(h: int, wanted: list[tuple[int, int]]) -> list[SimpleNamespace]:
        out = []
        for fid, scope in wanted:
            if h == 1 or fid not in counters[0]:
                out.append(SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=3, valueType=3,
                                           value=SimpleNamespace(ullVal=0)))
            else:
                out.append(SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=0, valueType=3,
                                           value=SimpleNamespace(ullVal=int(counters[0][fid]))))
        return out

    ns = SimpleNamespace(
        NVMLError=FakeNVMLError, NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_FUNCTION_NOT_FOUND=13,
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1, NVML_FI_DEV_PCIE_COUNT_TX_BYTES=197, NVML_FI_DEV_PCIE_COUNT_RX_BYTES=198,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=138, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=139,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=16 * 1024 * MIB, used=(h + 1) * 1024 * MIB),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=90 + h, memory=40),
        nvmlDeviceGetClockInfo=lambda h, kind: 1410 if kind == 1 else 1593,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 400_000,
        nvmlDeviceGetTemperature=lambda h, sensor: 60,
        nvmlDeviceGetCurrentClocksEventReasons=not_supported,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x40,
        nvmlDeviceGetFieldValues=fields,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=7), SimpleNamespace(pid=3)],
        nvmlDeviceGetPcieThroughput=lambda h, counter: 2048 if counter == 0 else 1024,
        nvmlSystemGetDriverVersion=lambda: b"550.90.07",
    )
    for name in list(vars(ns)):
        if name.startswith("nvml"):
            setattr(ns, name, counted(name, getattr(ns, name)))
    ns.calls = calls
    ns.counters = counters
    return ns


if __name__ == "__main__":
    sys.modules["pynvml"] = fake_pynvml()
    from gpuidle.cli import main

    sys.exit(main(sys.argv[1:]))
