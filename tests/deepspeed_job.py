"""A small DeepSpeed ZeRO job under the tracker, run by ``tests/test_tracker_deepspeed.py``.

    torchrun --standalone --nproc_per_node=2 tests/deepspeed_job.py OUT_DIR STAGE

DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) with gloo: real ZeRO partitioning, gradient
reduce-scatters and, at stage 3, parameter all-gathers in DeepSpeed's own hooks (every parameter
partitioned: ``stage3_param_persistence_threshold`` 0). Rank 1's forward takes 10 ms longer (a
straggler), so rank 0 waits for it in the first collective of each step.
"""

from __future__ import annotations

import os
import sys
import time

import deepspeed
import deepspeed.comm.torch
import torch
from torch import nn

from gpuidle.torch import StepTracker

STRAGGLER_S = 0.030


def main() -> None:
    out, stage = sys.argv[1], int(sys.argv[2])
    # the shared-memory all-reduce of the CPU accelerator (for inference) needs a C++ build at start-up: not used here
    deepspeed.comm.torch.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    config = {"train_micro_batch_size_per_gpu": 32, "steps_per_print": 10 ** 9,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    tracker = StepTracker(out, model=engine, every=10, log_every=10, ledger=False)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(30)]
    for x, y in tracker.loader(batches):
        with tracker.phase("forward"):
            if rank == 1:
                time.sleep(STRAGGLER_S)
            loss = nn.functional.cross_entropy(engine(x), y)
        with tracker.phase("backward"):
            engine.backward(loss)
        with tracker.phase("optimizer"):
            engine.step()
        tracker.step()
    tracker.close()
    # leave together: a process that exits while the other is still in a gloo collective aborts it
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
