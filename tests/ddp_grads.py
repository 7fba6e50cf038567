"""Run under ``torchrun --nproc_per_node=2``: DDP's gradients with the tracker's timed all-reduce are DDP's own.

Two copies of one model, one plain and one under ``StepTracker(model=...)``, take three steps on data that
differs by rank; their gradients, accumulated, must be equal (the mean over the ranks), and the tracked one's
every bucket timed. Prints one JSON line from rank 0: the largest gradient difference and, per step, the
buckets and their time.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from gpuidle.live.tracker import StepTracker

STEPS = 3


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    plain = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.1)
    timed = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.1)
    with tempfile.TemporaryDirectory() as out:
        tracker = StepTracker(out, model=timed, log=lambda _: None, ledger=False, every=1)
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(rank))
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
                          "comm_ns": [r["comm_ns"] for r in steps]}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
