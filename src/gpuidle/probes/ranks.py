"""Run one measurement on every rank: under torchrun, or on local ranks spawned here.

Under a launcher (``torchrun``, or anything that sets ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``) every process joins the job's process group and
rank 0 gets the result. Standalone, :func:`run_on_ranks` starts ``nproc`` local ranks
that meet through a file store in a temporary folder (no port to pick, none to clash),
relays rank 0's progress and returns rank 0's result. Spawned ranks get one intra-op
thread unless ``OMP_NUM_THREADS`` says otherwise, as torchrun gives its workers: both
launch modes then measure the same processes (more threads than cores per rank spin
against the other ranks' communication threads).

The measurement is a module-level function ``(ctx, config, progress) -> result`` so
that spawned ranks can import it; its collectives must be issued in the same order on
every rank, which is why every decision that depends on a timing is agreed first
(:meth:`RankContext.agree`).
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuidle.errors import GpuidleError
from gpuidle.probes.common import import_dist, import_torch

Progress = Callable[[str, int, int], None]
"""``(what, done, total)``, called on rank 0 only."""
R = TypeVar("R")
C = TypeVar("C")
Measure = Callable[["RankContext", C, "Progress | None"], R]

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
POLL_S = 0.05
LAUNCHER_THREADS_ENV = "OMP_NUM_THREADS"


def under_launcher() -> bool:
    """True inside torchrun (or any launcher that sets the env:// variables)."""
    return all(k in os.environ for k in LAUNCHER_ENV)


def resolve_device(device: str = "auto") -> tuple[str, str]:
    """``(device type, backend)``: ``cuda``/``nccl`` when asked for or available, else ``cpu``/``gloo``."""
    torch = import_torch()
    if device not in ("auto", "cuda", "cpu"):
        raise GpuidleError(f"unknown device {device!r}", "choose auto, cuda or cpu")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise GpuidleError("--device cuda, but PyTorch sees no CUDA device",
                               "use --device cpu for gloo over the CPU, or install a CUDA build of torch")
        return "cuda", "nccl"
    return "cpu", "gloo"


@dataclass(slots=True)
class RankContext:
    """This rank's place in the job, and the few collectives the probes agree through."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device_type: str
    backend: str
    device: Any
    """The ``torch.device`` this rank's buffers live on."""
    hosts: list[str]
    """Host name of every rank, by rank."""
    threads: int
    """This rank's intra-op threads (``torch.get_num_threads()``)."""

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))

    def sync(self) -> None:
        """Wait for the device: a collective on a GPU returns before it has run."""
        if self.device_type == "cuda":
            import_torch().cuda.synchronize(self.device)

    def agree(self, values: list[float], op: str = "max") -> list[float]:
        """The same numbers on every rank (max, min or sum over ranks); doubles as a barrier."""
        torch, dist = import_torch(), import_dist()
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        red = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}[op]
        dist.all_reduce(t, op=red)
        return [float(v) for v in t.cpu().tolist()]

    def gather_objects(self, obj: object) -> list[object]:
        out: list[object] = [None] * self.world_size
        import_dist().all_gather_object(out, obj)
        return out


def _join(rank: int, world_size: int, local_rank: int, local_world_size: int, device_type: str, backend: str,
          timeout_s: float, init_method: str | None) -> RankContext:
    torch, dist = import_torch(), import_dist()
    if device_type == "cuda":
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise GpuidleError(f"{local_world_size} ranks on this node but only {count} CUDA device(s)",
                               "start one rank per GPU (--nproc / --nproc_per_node)")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=world_size)
    dist.init_process_group(**kwargs)
    hosts: list[object] = [None] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    return RankContext(rank, world_size, local_rank, local_world_size, device_type, backend, device,
                       [str(h) for h in hosts], torch.get_num_threads())


def _leave() -> None:
    dist = import_dist()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_on_ranks(measure: Measure[C, R], config: C, *, nproc: int | None = None, device: str = "auto",
                 timeout_s: float = 300.0, progress: Progress | None = None,
                 start_method: str | None = None) -> R | None:
    """Run ``measure`` on every rank; rank 0's result (None on the other ranks of a launcher).

    ``nproc`` local ranks are spawned unless a launcher started this process: fresh
    interpreters, as torchrun starts its workers (a forked rank would inherit this
    process's threads and memory, and CUDA does not survive a fork), at the cost of one
    torch import per rank.
    """
    device_type, backend = resolve_device(device)
    if under_launcher():
        env = os.environ
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        try:
            ctx = _join(rank, world, local_rank, local_world, device_type, backend, timeout_s, None)
            result = measure(ctx, config, progress if rank == 0 else None)
            return result if rank == 0 else None
        finally:
            _leave()
    if nproc is None:
        torch = import_torch()
        nproc = torch.cuda.device_count() if device_type == "cuda" else 2
    if nproc < 2:
        raise GpuidleError(f"{nproc} rank measures no communication",
                           "give --nproc 2 or more, or run under torchrun with several processes")
    return _spawn(measure, config, nproc, device_type, backend, timeout_s, progress, start_method)


def _spawned(local_rank: int, measure: Measure[C, R], config: C, nproc: int, device_type: str, backend: str,
             timeout_s: float, store: str, queue: Any) -> None:
    try:
        if LAUNCHER_THREADS_ENV not in os.environ:  # what torchrun sets for more than one process per node
            os.environ[LAUNCHER_THREADS_ENV] = "1"
            import_torch().set_num_threads(1)
        ctx = _join(local_rank, nproc, local_rank, nproc, device_type, backend, timeout_s, f"file://{store}")

        def relay(what: str, done: int, total: int) -> None:
            queue.put(("progress", (what, done, total)))

        result = measure(ctx, config, relay if local_rank == 0 else None)
        if local_rank == 0:
            queue.put(("result", result))
    except GpuidleError as err:
        queue.put(("error", f"rank {local_rank}: {err}"))
        raise SystemExit(3) from None
    except Exception as err:  # a torch.distributed failure is the user's environment, not our bug
        queue.put(("error", f"rank {local_rank}: {type(err).__name__}: {str(err).strip().splitlines()[0]}"))
        raise SystemExit(3) from None
    finally:
        _leave()


def _spawn(measure: Measure[C, R], config: C, nproc: int, device_type: str, backend: str, timeout_s: float,
           progress: Progress | None, start_method: str | None) -> R:
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

    method = start_method or "spawn"
    queue = mp.get_context(method).SimpleQueue()
    result: list[R] = []
    errors: list[str] = []

    def drain() -> None:
        while not queue.empty():
            kind, payload = queue.get()
            if kind == "progress" and progress is not None:
                progress(*payload)
            elif kind == "result":
                result.append(payload)
            elif kind == "error":
                errors.append(payload)

    with tempfile.TemporaryDirectory(prefix="gpuidle-ranks-") as tmp:
        store = os.path.join(tmp, "store")
        ctx = start_processes(  # type: ignore[no-untyped-call]
            _spawned, args=(measure, config, nproc, device_type, backend, timeout_s, store, queue),
            nprocs=nproc, join=False, start_method=method)
        try:
            while not ctx.join(timeout=POLL_S):
                drain()
        except (ProcessExitedException, ProcessRaisedException) as exc:
            drain()
            raise GpuidleError(errors[0] if errors else f"a rank failed: {str(exc).strip().splitlines()[-1]}",
                               "see the lines above; --device cpu runs the probe over gloo") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        drain()
    if not result:
        raise GpuidleError("rank 0 ended without a result", errors[0] if errors else None)
    return result[0]
