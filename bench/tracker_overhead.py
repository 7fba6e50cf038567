"""Cost of the step tracker: the DDP workload with and without it, interleaved A/B in one run (target ≤ 0.5 %).

    python bench/tracker_overhead.py                          # 2 ranks (gloo on CPU, NCCL on GPUs)
    python bench/tracker_overhead.py --ranks 2 --rounds 30 --block 40 --device-ms 20

All arms run in the same processes on the same data: identical DDP models, two plain (A and
A', DDP's built-in all-reduce) and one with the tracker (B: its phases, its loader wrapper, its
comm hook, the exchange every 50 steps). Blocks of ``--block`` steps rotate A A' B, B A' A, …,
each started behind a barrier, so drift and other jobs on the machine hit all arms alike.
The figure is the mean of the per-round differences of the step time, B against A, with its
95 % confidence interval; A' against A is the control: two identical arms differ by that
much on this machine, so a difference below it is not the tracker's. The tracker's own host
time per step (the same calls on an empty loop, one process) follows, the cost without the noise.

Without a GPU the workload simulates device time by sleeping (``--device-ms``), as in the
tests. Results go to ``bench/out/tracker_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "out"
T95 = {5: 2.571, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}
"""Two-sided 95 % quantiles of Student's t by degrees of freedom (the next lower entry is used)."""


def t95(df: int) -> float:
    return T95[max(k for k in T95 if k <= max(df, 5))]


def launch(args: argparse.Namespace) -> int:
    """Run this script under torchrun with ``--ranks`` ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
           __file__, "--rank-side", *sys.argv[1:]]
    return subprocess.call(cmd, env=env)


def own_cost(steps: int = 20_000, repeats: int = 3) -> float:
    """The tracker's host time per step (µs): four phases and a step on an empty loop, one process.

    The best of ``repeats``: other jobs on the machine only ever add to it.
    """
    return min(_own_cost(steps) for _ in range(repeats))


def _own_cost(steps: int) -> float:
    from gpuidle.live.tracker import StepTracker

    with tempfile.TemporaryDirectory() as d:
        tr = StepTracker(d, device_clock=None, log=lambda _: None, log_every=None)
        batches = [0] * steps
        t0 = time.perf_counter_ns()
        for _ in tr.loader(batches):
            with tr.phase("h2d"):
                pass
            with tr.phase("forward"):
                pass
            with tr.phase("backward"):
                pass
            with tr.phase("optimizer"):
                pass
            tr.step()
        tracked = time.perf_counter_ns() - t0
        tr.close()
    t0 = time.perf_counter_ns()
    for _ in batches:
        pass
    bare = time.perf_counter_ns() - t0
    return (tracked - bare) / steps / 1e3


def rank_side(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from gpuidle.live import workload
    from gpuidle.live.tracker import StepTracker

    wargs = workload.parser().parse_args(["--steps", str(args.block + 1), "--device-ms", str(args.device_ms),
                                          "--batch", str(args.batch), "--width", str(args.width)])
    plain = workload.setup(wargs)
    control = workload.setup(wargs)
    tracked = workload.setup(wargs)
    rank = dist.get_rank()
    out = tempfile.mkdtemp(prefix="gpuidle-bench-")
    model = None if args.no_comm else tracked.model
    tracker = StepTracker(out, model=model, log_every=None, log=lambda _: None)
    arms = {"A": plain, "C": control, "B": tracked}
    for w in arms.values():  # warm-up: DDP rebuilds its buckets after the first steps
        dist.barrier()
        workload.train(w, tracker if w is tracked else None, 5)
    times: dict[str, list[float]] = {"A": [], "B": [], "C": []}
    for i in range(args.rounds):
        for arm in ("ACB" if i % 2 == 0 else "BCA"):
            w = arms[arm]
            dist.barrier()
            t0 = time.perf_counter_ns()
            n = workload.train(w, tracker if arm == "B" else None, args.block)
            dist.barrier()
            times[arm].append((time.perf_counter_ns() - t0) / n / 1e6)
    tracker.close()
    dist.destroy_process_group()
    if rank != 0:
        return
    pairs = [(b - a) / a for a, b in zip(times["A"], times["B"], strict=True)]
    mean = statistics.fmean(pairs)
    half = t95(len(pairs) - 1) * statistics.stdev(pairs) / math.sqrt(len(pairs))
    controls = [(c - a) / a for a, c in zip(times["A"], times["C"], strict=True)]
    control = statistics.fmean(controls)
    control_half = t95(len(controls) - 1) * statistics.stdev(controls) / math.sqrt(len(controls))
    step_ms = statistics.median(times["A"])
    cost_us = own_cost()
    result = {
        "ranks": int(os.environ.get("WORLD_SIZE", "1")), "rounds": args.rounds, "block_steps": args.block,
        "device_ms": args.device_ms, "comm_timed": not args.no_comm,
        "step_ms_without": step_ms, "step_ms_with": statistics.median(times["B"]),
        "overhead_mean": mean, "overhead_ci95": half, "overhead_median": statistics.median(pairs),
        "control_mean": control, "control_ci95": control_half,
        "tracker_host_us_per_step": cost_us,
        "tracker_host_share": cost_us / 1e3 / step_ms, "target": 0.005,
    }
    print(f"step time without the tracker {step_ms:.3f} ms, with {result['step_ms_with']:.3f} ms (medians of "
          f"{args.rounds} blocks of {args.block} steps each, {result['ranks']} ranks)")
    print(f"overhead {mean * 100:+.2f} % ± {half * 100:.2f} % (95 % CI over {len(pairs)} interleaved pairs); "
          f"target ≤ 0.5 %; median of the pairs {statistics.median(pairs) * 100:+.2f} %")
    print(f"control: two identical untracked arms differ by {control * 100:+.2f} % ± {control_half * 100:.2f} %")
    print(f"tracker host time {cost_us:.1f} µs/step = {result['tracker_host_share'] * 100:.3f} % of this step")
    OUT.mkdir(exist_ok=True)
    (OUT / "tracker_overhead.json").write_text(json.dumps(result, indent=2) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # not --nproc: torchrun reads every option of its command line, and that one prefixes two of its own
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=20, help="A/B pairs")
    p.add_argument("--block", type=int, default=40, help="steps per block")
    p.add_argument("--device-ms", type=float, default=12.0, help="simulated device time per step (no GPU)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--no-comm", action="store_true",
                   help="the tracker without timing DDP's communication (no comm hook): what the hook costs")
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_side:
        rank_side(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    raise SystemExit(main())
