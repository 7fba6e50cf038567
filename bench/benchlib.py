"""Shared pieces of the benchmark scripts: running one measurement in a child process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
CHILD = BENCH / "measure_child.py"
MAIN_PY = sys.executable
HTA_VENV = BENCH / ".venv-hta"
HTA_PY = HTA_VENV / "bin" / "python"
DEFAULT_SOURCE = Path("/work/shared/traces/negative_queue_length_values_check__rank0.json.gz")
MIB = 1 << 20


@dataclass
class Run:
    """One child measurement: what the child printed, plus what the parent saw."""

    tool: str
    ok: bool
    wall_s: float
    """Process start to exit: interpreter start-up and imports included."""
    tree_peak_rss: int
    """Largest RSS sum of the child and its descendants, sampled every 50 ms."""
    child: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def work_s(self) -> float:
        return float(self.child.get("work_s", float("nan")))

    @property
    def maxrss(self) -> int:
        return int(self.child.get("maxrss", 0))


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def run_child(tool: str, args: list[str], python: str | Path = MAIN_PY,
              timeout_s: float = 900.0, mem_limit: int = 16 << 30, src: Path | None = None) -> Run:
    """Run ``measure_child.py TOOL ARGS...`` under ``python``; kill it past the limits.

    :param src: a gpuidle ``src`` folder to import instead of the installed one.
    """
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(python), str(CHILD), tool, *args], stdout=subprocess.PIPE,
                                stderr=err, cwd=REPO, env=env)
        watched = psutil.Process(proc.pid)
        peak = 0
        killed = ""
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak, killed
            while not stop.wait(0.05):
                rss = _tree_rss(watched)
                peak = max(peak, rss)
                over = rss > mem_limit
                late = time.perf_counter() - t0 > timeout_s
                if (over or late) and not killed:
                    killed = (f"killed: RSS over {mem_limit / (1 << 30):.0f} GiB" if over
                              else f"killed: over {timeout_s:.0f} s")
                    try:
                        victims = [*watched.children(recursive=True), watched]
                    except psutil.Error:
                        victims = []
                    for p in victims:
                        with contextlib.suppress(psutil.Error):
                            p.kill()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out, _ = proc.communicate()
        wall = time.perf_counter() - t0
        stop.set()
        watcher.join()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    line = next((ln for ln in reversed(out.decode(errors="replace").splitlines()) if ln.startswith("@@")), None)
    if proc.returncode != 0 or line is None:
        why = killed or (stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return Run(tool, False, wall, peak, error=why)
    return Run(tool, True, wall, peak, child=json.loads(line[2:]))


def snapshot(rev: str, workdir: Path) -> tuple[Path, str]:
    """Export ``src/`` of commit ``rev`` to ``workdir``: the code measured stays fixed while
    the working tree changes. Returns the ``src`` folder and the full commit hash."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    dest = workdir / f"gpuidle-{commit[:12]}"
    if not (dest / "src" / "gpuidle").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src", commit


def hta_available() -> bool:
    return HTA_PY.exists()


def install_hta() -> None:
    """Create ``bench/.venv-hta`` with HolisticTraceAnalysis (CPU-only; no torch needed)."""
    if not HTA_PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
    subprocess.run([str(HTA_PY), "-m", "pip", "install", "HolisticTraceAnalysis"], check=True)


def mib(n: float) -> str:
    return f"{n / MIB:,.0f}" if n >= 10 * MIB else f"{n / MIB:,.1f}"


def write_json(name: str, data: Any) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def machine() -> dict[str, Any]:
    vm = psutil.virtual_memory()
    return {"cpus": psutil.cpu_count(), "mem_total": vm.total, "mem_available": vm.available,
            "load_avg": list(psutil.getloadavg()), "python": sys.version.split()[0],
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
