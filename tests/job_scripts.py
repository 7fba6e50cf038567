"""Running the tests' job scripts (a JAX loop, a Keras fit) in processes of their own, on this checkout's sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")
PYTHONPATH = os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])
"""This checkout's sources first, then whatever the environment adds (packages installed beside the interpreter)."""


def job_env(rank: int, world: int) -> dict[str, str]:
    """The environment of rank ``rank`` of ``world``: this checkout's sources; JAX on the CPU unless
    GPUIDLE_JAX_PLATFORMS names another (tests/gpu/check.sh: cuda)."""
    return {**os.environ, "PYTHONPATH": PYTHONPATH, "GPUIDLE_RANK": str(rank), "GPUIDLE_WORLD_SIZE": str(world),
            "JAX_PLATFORMS": os.environ.get("GPUIDLE_JAX_PLATFORMS", "cpu"), "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_job(script: Path, out: Path, mode: str, steps: int, rank: int = 0, world: int = 1) -> dict[str, float]:
    """One process of ``script OUT MODE STEPS`` as rank ``rank`` of ``world`` (GPUIDLE_RANK, GPUIDLE_WORLD_SIZE).
    The script's last line of output, a JSON object: what the job measured of itself."""
    proc = subprocess.run([sys.executable, str(script), str(out), mode, str(steps)], capture_output=True, text=True,
                          env=job_env(rank, world), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_ranks(script: Path, out: Path, modes: list[str], steps: int) -> None:
    """One process per rank at once, rank ``r`` in ``modes[r]``, all writing their logs to ``out``."""
    procs = [subprocess.Popen([sys.executable, str(script), str(out), mode, str(steps)], text=True,
                              env=job_env(rank, len(modes)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank, mode in enumerate(modes)]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err[-3000:]
