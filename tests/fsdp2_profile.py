"""Profiles a tiny FSDP2 job on the CPU: the source of ``data/fsdp2_cpu_gloo__rank0.pt.trace.json.gz``.

``torchrun --standalone --nproc_per_node=2 tests/fsdp2_profile.py OUT_DIR`` (torch 2.13.0, gloo): three
``Linear(64, 64)`` each under ``fully_shard``, the root too; one step to warm up, then two profiled
steps with ``forward``/``backward``/``optimizer`` ranges. It records FSDP2's ``FSDP::`` labels and the
c10d and gloo collectives as PyTorch records them on a CPU (no device work).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile, record_function


def main(out: str) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 64)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(2):
            with record_function(f"ProfilerStep#{i}"):
                with record_function("forward"):
                    loss = model(x).sum()
                with record_function("backward"):
                    loss.backward()
                with record_function("optimizer"):
                    opt.step()
                    opt.zero_grad()
    prof.export_chrome_trace(f"{out}/fsdp2_cpu_gloo_rank{dist.get_rank()}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
