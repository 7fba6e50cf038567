"""A tiny 2-D job on the CPU: the process groups that ``init_device_mesh`` makes, as a trace records them.

``torchrun --standalone --nproc_per_node=4 tests/mesh_profile.py OUT_DIR`` (gloo): a ``(2, 2)`` mesh named
``("dp", "tp")``, a two-layer MLP split by ``ColwiseParallel``/``RowwiseParallel`` over ``tp`` and its gradients
all-reduced over ``dp``; one profiled step. Each rank writes its trace and ``rank<N>.json``: the trace's
``distributedInfo`` and torch's own answer for the rank's place (``DeviceMesh.get_coordinate``) and groups.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.profiler import ProfilerActivity, profile, record_function


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("ProfilerStep#0"):
        mlp(x).sum().backward()
        for p in mlp.parameters():
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(grad, group=mesh["dp"].get_group())
    rank = dist.get_rank()
    path = f"{out}/mesh_rank{rank}.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        info = json.load(f)["distributedInfo"]
    truth = {"distributedInfo": info, "coordinate": dict(zip(("dp", "tp"), mesh.get_coordinate() or [], strict=True)),
             "groups": {d: dist.get_process_group_ranks(mesh[d].get_group()) for d in ("dp", "tp")}}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(truth, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
