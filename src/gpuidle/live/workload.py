"""A real DDP or FSDP2 training job with bottlenecks to switch on, for the tracker's tests and benchmark.

Run with ``torchrun --standalone --nproc_per_node=2 -m gpuidle.live.workload --out DIR``: an
MLP under ``DistributedDataParallel`` (``--shard``: ``fully_shard`` per block and at the root, FSDP2)
(gloo on CPU, NCCL on GPU) trains on batches from a
map-style dataset, with the tracker around each phase. The device's compute is simulated
by the host sleeping (``--device-ms``), so two ranks on two CPU cores keep steady timings
and leave the cores to the communication threads. Each bottleneck is a real one:

- ``--item-delay-ms``: the dataset sleeps this long per sample (slow decoding): ``data_loading``;
  with ``--data-rank R`` on rank R only (a slow shard or host);
- ``--straggler-rank R --straggler-ms T``: rank R's forward takes T ms longer (a slow device):
  the other ranks wait in the all-reduce, ``straggler_wait``;
- ``--comm-mb M``: an extra M MiB parameter used first in the forward, so its gradient is
  ready last and its all-reduce has nothing to overlap: ``communication`` (the optimizer leaves
  it alone, so its cost is the all-reduce, not an update of M MiB);
- ``--item-sync``: ``loss.item()`` every step, a host sync on a GPU (``host_sync``).

Batches are prepared once and served whole (``batch_size=None``), so with no bottleneck
switched on, loading costs microseconds and nothing should be flagged.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` batches of random samples, a few distinct ones cycled; ``item_delay_s`` per sample."""

    def __init__(self, n: int, batch: int, dim: int, classes: int, item_delay_s: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self._data = [(torch.randn(batch, dim, generator=g), torch.randint(0, classes, (batch,), generator=g))
                      for _ in range(4)]
        self._n = n
        self._delay = item_delay_s * batch

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._delay:
            time.sleep(self._delay)
        return self._data[i % len(self._data)]


class DeviceTime(torch.autograd.Function):
    """Work on a simulated device: the host sleeps ``forward_s`` in forward and ``backward_s`` in backward.

    A GPU computes while the host waits; sleeping reproduces that timing without taking a
    CPU core from the other ranks and their communication threads.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        if forward_s:
            time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.backward_s:
            time.sleep(ctx.backward_s)
        return grad, None, None


class Mlp(nn.Module):
    """Three linear layers; simulated device time after the first, so gradients of the later
    layers are all-reduced while it runs (overlapped), and the first layer's after (exposed)."""

    def __init__(self, dim: int, width: int, classes: int, extra_mb: float, device_s: float) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(dim, width), nn.ReLU())
        self.rest = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes))
        self.device_s = device_s
        n = int(extra_mb * (1 << 20) / 4)
        self.extra = nn.Parameter(torch.zeros(n)) if n else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra is not None:
            x = x + self.extra[0] * 0.0  # used first: its gradient is ready last in backward
        h = self.first(x)
        if self.device_s:
            h = DeviceTime.apply(h, self.device_s / 3, self.device_s * 2 / 3)  # type: ignore[no-untyped-call]
        out: torch.Tensor = self.rest(h)
        return out


@dataclass(slots=True)
class Workload:
    model: nn.Module
    """The DDP-wrapped or fully_shard-ed model."""
    loader: DataLoader[tuple[torch.Tensor, torch.Tensor]]
    optimizer: torch.optim.Optimizer
    device: torch.device
    rank: int
    straggler_s: float
    item_sync: bool


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpuidle-run", help="tracker output folder")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--device-ms", type=float, default=12.0,
                   help="simulated device time per step (forward a third, backward two thirds); 0: none")
    p.add_argument("--item-delay-ms", type=float, default=0.0)
    p.add_argument("--data-rank", type=int, default=-1, help="the rank whose data is slow (-1: every rank)")
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-ms", type=float, default=0.0)
    p.add_argument("--comm-mb", type=float, default=0.0)
    p.add_argument("--bucket-mb", type=float, default=0.25, help="DDP bucket_cap_mb")
    p.add_argument("--shard", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--item-sync", action="store_true")
    p.add_argument("--every", type=int, default=10, help="tracker exchange interval, steps")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--profile", default="", help="profile a window of steps, START:STOP")
    p.add_argument("--no-tracker", action="store_true", help="the same loop without the tracker")
    p.add_argument("--group", default="auto", choices=["auto", "default", "gloo"], help="the tracker's exchange group")
    return p


def setup(args: argparse.Namespace) -> Workload:
    """Process group, model, data and optimizer for this rank (needs torchrun's environment)."""
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = Mlp(args.dim, args.width, 10, args.comm_mb, args.device_ms / 1e3).to(device)
    wrapped: nn.Module
    if args.shard:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.first)
        fully_shard(model.rest)
        fully_shard(model)
        wrapped = model
    else:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                                      bucket_cap_mb=args.bucket_mb)
    delay_s = args.item_delay_ms / 1e3 if args.data_rank in (-1, rank) else 0.0
    data = Batches(args.steps, args.batch, args.dim, 10, delay_s, seed=rank)
    loader: DataLoader[tuple[torch.Tensor, torch.Tensor]] = DataLoader(data, batch_size=None, shuffle=False,
                                                                        pin_memory=cuda)
    params = [p for name, p in model.named_parameters() if name != "extra"]
    return Workload(model=wrapped, loader=loader, optimizer=torch.optim.SGD(params, lr=0.01), device=device,
                    rank=rank, straggler_s=args.straggler_ms / 1e3 if rank == args.straggler_rank else 0.0,
                    item_sync=args.item_sync)


def train(w: Workload, tracker: object | None, steps: int) -> int:
    """Run ``steps`` steps (fewer if the loader ends), timed by ``tracker`` when given; return the count."""
    from gpuidle.live.tracker import StepTracker

    t = tracker if isinstance(tracker, StepTracker) else None
    done = 0
    batches = t.loader(w.loader) if t is not None else iter(w.loader)
    for x, y in batches:
        if done == steps:
            break
        if t is None:
            _step(w, x, y)
        else:
            with t.phase("h2d"):
                x, y = x.to(w.device, non_blocking=True), y.to(w.device, non_blocking=True)
            with t.phase("forward"):
                loss = _forward(w, x, y)
            with t.phase("backward"):
                loss.backward()  # type: ignore[no-untyped-call]
            with t.phase("optimizer"):
                w.optimizer.step()
                w.optimizer.zero_grad(set_to_none=True)
                if w.item_sync:
                    loss.item()
            t.step()
        done += 1
    return done


def _forward(w: Workload, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if w.straggler_s:
        time.sleep(w.straggler_s)
    return nn.functional.cross_entropy(w.model(x), y)


def _step(w: Workload, x: torch.Tensor, y: torch.Tensor) -> None:
    x, y = x.to(w.device, non_blocking=True), y.to(w.device, non_blocking=True)
    loss = _forward(w, x, y)
    loss.backward()  # type: ignore[no-untyped-call]
    w.optimizer.step()
    w.optimizer.zero_grad(set_to_none=True)
    if w.item_sync:
        loss.item()


def main(argv: Sequence[str] | None = None) -> int:
    from gpuidle.live.tracker import StepTracker

    args = parser().parse_args(argv)
    w = setup(args)
    try:
        if args.no_tracker:
            train(w, None, args.steps)
            return 0
        tracker = StepTracker(args.out, model=w.model, every=args.every, log_every=args.log_every, group=args.group)
        if args.profile:
            start, stop = (int(x) for x in args.profile.split(":"))
            tracker.profile(range(start, stop))
        train(w, tracker, args.steps)
        tracker.close()
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
