"""A two-stage ``torch.distributed.pipelining`` job and an expert-style ``all_to_all_single`` on the CPU: the
names a trace gives their collectives, as PyTorch records them on gloo.

``torchrun --standalone --nproc_per_node=2 tests/pipeline_profile.py OUT_DIR``: one ``Linear`` per stage under
``Schedule1F1B`` with 4 microbatches, then one ``all_to_all_single``; one profiled step, written as
``pipeline_rank<N>.json``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.profiler import ProfilerActivity, profile, record_function

MICROBATCHES = 4


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    stage = PipelineStage(torch.nn.Linear(16, 16), rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=lambda y, _: y.sum())

    def run() -> None:
        if rank == 0:
            schedule.step(torch.randn(8, 16))
        else:
            schedule.step(target=torch.zeros(8, 16), losses=[])

    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("ProfilerStep#0"):
        run()
        tokens = torch.arange(4, dtype=torch.float32)
        dist.all_to_all_single(torch.empty(4), tokens)
    prof.export_chrome_trace(f"{out}/pipeline_rank{rank}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
