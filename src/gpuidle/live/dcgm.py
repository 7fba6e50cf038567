"""DCGM profiling fields (SM active, occupancy, tensor and DRAM activity) from dcgm-exporter or ``dcgmi dmon``."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request

DCGM_EXPORTER_FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}
DCGMI_FIELD_IDS = {1002: "sm_active", 1003: "sm_occupancy", 1004: "tensor_active", 1005: "dram_active"}
DCGMI_COLUMNS = {"SMACT": "sm_active", "SMOCC": "sm_occupancy", "TENSO": "tensor_active", "DRAMA": "dram_active"}
"""The short column names ``dcgmi dmon`` prints for fields 1002-1005."""

_PROM_LINE = re.compile(r'^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_PROM_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

DcgmValues = dict[int, dict[str, float]]
"""GPU index -> {``sm_active``: 0.42, ...}."""


def parse_dcgm_exporter(text: str) -> DcgmValues:
    """The four profiling fields per GPU from dcgm-exporter's Prometheus text."""
    out: DcgmValues = {}
    for line in text.splitlines():
        if not line.startswith("DCGM_FI_PROF_"):
            continue
        m = _PROM_LINE.match(line)
        if not m or m["name"] not in DCGM_EXPORTER_FIELDS:
            continue
        labels = dict(_PROM_LABEL.findall(m["labels"] or ""))
        try:
            gpu, value = int(labels["gpu"]), float(m["value"])
        except (KeyError, ValueError):
            continue
        out.setdefault(gpu, {})[DCGM_EXPORTER_FIELDS[m["name"]]] = value
    return out


class DcgmiParser:
    """``dcgmi dmon -e 1002,1003,1004,1005`` output, one line at a time.

    The tool prints a header (``#Entity   SMACT  SMOCC ...``), a unit line (``ID``), then
    ``GPU 0   0.512  0.301 ...`` per GPU per interval; ``N/A`` when a field is missing.
    """

    def __init__(self) -> None:
        self.columns: list[str] = []

    def feed(self, line: str) -> tuple[int, dict[str, float]] | None:
        parts = line.split()
        if not parts:
            return None
        if parts[0].startswith("#"):
            names = [p for p in (parts[0][1:], *parts[1:]) if p and p != "Entity"]
            self.columns = [DCGMI_COLUMNS.get(n, n) for n in names]
            return None
        if parts[0] != "GPU" or len(parts) < 2 or not parts[1].isdigit():
            return None
        values: dict[str, float] = {}
        for name, raw in zip(self.columns, parts[2:], strict=False):
            if name in DCGMI_COLUMNS.values():
                try:
                    values[name] = float(raw)
                except ValueError:
                    continue
        return int(parts[1]), values


class DcgmReader:
    """Keeps the latest profiling values per GPU, read in a thread of its own.

    The sampler takes each reading once (:meth:`take`), so a value appears in the log
    at the first sample after it was read, and no stale value repeats.
    """

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.error: str | None = None
        self._lock = threading.Lock()
        self._fresh: DcgmValues = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def put(self, values: DcgmValues) -> None:
        with self._lock:
            for gpu, v in values.items():
                self._fresh.setdefault(gpu, {}).update(v)

    def take(self) -> DcgmValues:
        with self._lock:
            out, self._fresh = self._fresh, {}
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuidle-dcgm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class DcgmExporterReader(DcgmReader):
    """Scrapes a dcgm-exporter endpoint (``http://host:9400/metrics``) every ``period_s``."""

    def __init__(self, url: str, period_s: float = 1.0) -> None:
        super().__init__(period_s)
        self.url = url

    def scrape(self) -> DcgmValues:
        try:
            with urllib.request.urlopen(self.url, timeout=min(self.period_s, 2.0)) as r:
                return parse_dcgm_exporter(r.read().decode("utf-8", errors="replace"))
        except (urllib.error.URLError, OSError, ValueError) as err:
            self.error = f"dcgm-exporter at {self.url}: {err}"
            return {}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.put(self.scrape())
            self._stop.wait(self.period_s)


class DcgmiReader(DcgmReader):
    """Runs ``dcgmi dmon`` and reads its lines as they come."""

    def __init__(self, period_s: float = 1.0, exe: str = "dcgmi") -> None:
        super().__init__(period_s)
        self.exe = exe
        self._proc: subprocess.Popen[str] | None = None

    def _run(self) -> None:
        fields = ",".join(str(f) for f in DCGMI_FIELD_IDS)
        cmd = [self.exe, "dmon", "-e", fields, "-d", str(max(int(self.period_s * 1000), 100))]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          stdin=subprocess.DEVNULL)
        except OSError as err:
            self.error = f"dcgmi: {err}"
            return
        parser = DcgmiParser()
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if self._stop.is_set():
                break
            got = parser.feed(line)
            if got is not None:
                self.put({got[0]: got[1]})
            elif "error" in line.lower():
                self.error = f"dcgmi dmon: {line.strip()}"
        if self._proc.poll() is None:
            self._proc.terminate()

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        super().stop()


def dcgm_reader(url: str | None, use_dcgmi: bool = True) -> DcgmReader | None:
    """dcgm-exporter when a URL is given, else ``dcgmi dmon`` when it is on PATH, else nothing."""
    if url:
        return DcgmExporterReader(url)
    exe = shutil.which("dcgmi") if use_dcgmi else None
    return DcgmiReader(exe=exe) if exe else None
