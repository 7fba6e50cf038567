"""A 2-stage pipeline × 2 data-parallel job on four gloo ranks, under the step tracker.

``torchrun --standalone --nproc_per_node=4 tests/mesh_tracker_job.py OUT_DIR SLOW_STAGE_MS``: the mesh is made
with ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))`` before the tracker starts; each step's
``forward`` computes for 20 ms on stage 0 and ``SLOW_STAGE_MS`` on stage 1 (busy loops: the host clock times
the phases on a CPU). Each rank writes ``truth-<rank>.json``: torch's own place of the rank in the mesh.
"""

from __future__ import annotations

import json
import sys
import time

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from gpuidle.torch import StepTracker

STEPS = 12


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def main(out: str, slow_ms: float) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage = mesh.get_coordinate()[0]  # type: ignore[index]
    tracker = StepTracker(out_dir=out, every=4, ledger=False, device_clock=None)
    for _ in range(STEPS):
        with tracker.phase("forward"):
            spin(slow_ms if stage == 1 else 20.0)
        dist.barrier()  # the stages meet once a step, as a pipeline's schedule makes them
        tracker.step()
    tracker.close()
    with open(f"{out}/truth-{dist.get_rank()}.json", "w") as f:
        json.dump(dict(zip(("pp", "dp"), mesh.get_coordinate() or [], strict=True)), f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
