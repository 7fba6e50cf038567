"""Run under ``torchrun`` (:func:`launch`): DDP's gradients with the tracker's timed all-reduce are DDP's own.

Two copies of one model, one plain and one under ``StepTracker(model=...)``, take three steps on data that
differs by rank; their gradients, accumulated, must be equal (the mean over the ranks), and the tracked one's
every bucket timed. NCCL on CUDA devices (one per rank), else gloo. Prints one JSON line from rank 0: the
largest gradient difference, per step the buckets and their time, and whether the hook averaged in NCCL.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuidle.live.tracker import StepTracker, ddp

STEPS = 3
HANG_GUARD_S = 600
"""Not a performance bound: only so that a rendezvous that never completes fails the test."""


def launch(ranks: int) -> dict[str, Any]:
    """This script under torchrun with ``ranks`` processes: rank 0's JSON line."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", __file__]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    in_nccl: list[bool] = []
    timed_allreduce = ddp.timed_allreduce
    ddp.timed_allreduce = lambda nccl, *a: (in_nccl.append(nccl), timed_allreduce(nccl, *a))[1]  # type: ignore[assignment]
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)).to(device)
    ids = [device.index] if cuda else None
    plain = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=ids, bucket_cap_mb=0.1)
    timed = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=ids, bucket_cap_mb=0.1)
    with tempfile.TemporaryDirectory() as out:
        tracker = StepTracker(out, model=timed, log=lambda _: None, ledger=False, every=1)
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(rank)).to(device)
        for _ in tracker.loader([x] * STEPS):
            with tracker.phase("forward"):
                loss = timed(x).square().mean()
            with tracker.phase("backward"):
                loss.backward()
            tracker.step()
        tracker.close()
        rows = [json.loads(line) for line in Path(out, f"rank-{rank}.jsonl").read_text().splitlines()]
    for _ in range(STEPS):
        plain(x).square().mean().backward()
    diff = max(float((a.grad - b.grad).abs().max()) for a, b in zip(plain.parameters(), timed.parameters(),
                                                                     strict=True))
    del plain, timed  # before the group: gloo's destructor can wait forever on a model that outlives it
    dist.destroy_process_group()
    if rank == 0:
        steps = [r for r in rows if r["type"] == "step"]
        print(json.dumps({"max_diff": diff, "steps": len(steps), "buckets": [r["buckets"] for r in steps],
                          "comm_ns": [r["comm_ns"] for r in steps], "averaged_in_nccl": in_nccl}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
