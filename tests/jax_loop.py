"""A small JAX training loop under ``gpuidle.jax.StepTracker``, run as a script by the tests.

    python tests/jax_loop.py OUT_DIR MODE [STEPS]     # MODE: data, sync, hostwork, hostbound, light, slow
Rank and world size come from GPUIDLE_RANK / GPUIDLE_WORLD_SIZE (independent processes writing
their rank logs to one folder); with GPUIDLE_JAX_COORDINATOR=HOST:PORT the processes are connected by
``jax.distributed`` (CPU collectives over gloo) and the tracker exchanges its steps through JAX.
Prints one JSON line: what the loop did, timed by itself
(``loop_s``: the steps alone, without ``close``; ``sync_s``: of that, the time in ``float(loss)``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from gpuidle.jax import StepTracker

DATA_DELAY_S = 0.015
LIGHT_DELAY_S = 0.003
SLOW_DELAY_S = 0.04
"""A rank whose data is slow enough to stand out however loaded the machine is."""
HOST_WORK_S = 0.001
"""Well less than the time the sync blocks (about 2.2 ms a step on a 2-core CPU): the sync, not the host, is what
leaves the device idle. At 2 ms the two were within 0.1 ms of each other, and a busy machine stretched the host's
work past the block, its idle then the host's own (unattributed) rather than the sync's."""
HOST_BOUND_WORK_S = 0.008
"""More than the step's device work (``hostbound``): without the sync the host still sets the pace."""


SYNC_MODES = ("sync", "hostwork", "hostbound")


@jax.jit
def train_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return w - 1e-3 * x.mean(), x.sum()


def batches(n: int, delay: float, x: jax.Array) -> Iterator[jax.Array]:
    for _ in range(n):
        if delay:
            time.sleep(delay)
        yield x


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    rank, world = int(os.environ.get("GPUIDLE_RANK", "0")), int(os.environ.get("GPUIDLE_WORLD_SIZE", "1"))
    coordinator = os.environ.get("GPUIDLE_JAX_COORDINATOR")
    if coordinator:  # processes JAX connects: the tracker takes rank and world from JAX and exchanges through it
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes=world, process_id=rank)
    # the sync modes' steps are longer on the device than the host work the loop does between them (a GPU needs
    # a wider model for that)
    dim = 256 if jax.default_backend() == "cpu" else 4096
    w, x = jnp.full((dim, dim), 0.01), jnp.ones((4 * dim if mode in SYNC_MODES else dim // 2, dim))
    w, loss = train_step(w, x)
    loss.block_until_ready()
    # the loop's own device time per step, measured synchronously beforehand (the reference)
    t0 = time.perf_counter()
    for _ in range(20):
        w, loss = train_step(w, x)
        loss.block_until_ready()
    compute_s = (time.perf_counter() - t0) / 20
    tracker = StepTracker(out, every=20, ledger=False, log=lambda line: None) if coordinator else \
        StepTracker(out, rank=rank, world_size=world, every=20, ledger=False, log=lambda line: None)
    t0 = time.perf_counter()
    delay = {"data": DATA_DELAY_S, "light": LIGHT_DELAY_S, "slow": SLOW_DELAY_S}.get(mode, 0.0)
    sync_s = 0.0
    for batch in tracker.loader(batches(steps, delay, x)):
        with tracker.phase("train_step"):
            w, loss = train_step(w, batch)
        if mode in ("sync", "hostbound"):
            s0 = time.perf_counter()
            float(loss)
            sync_s += time.perf_counter() - s0
        if mode in ("sync", "hostwork"):  # hostwork: the same host work without the sync (the sync fix's after-state)
            time.sleep(HOST_WORK_S)
        elif mode == "hostbound":
            time.sleep(HOST_BOUND_WORK_S)
        tracker.step(loss)
    loss.block_until_ready()
    loop_s = time.perf_counter() - t0
    tracker.close()
    print(json.dumps({"wall_s": time.perf_counter() - t0, "loop_s": loop_s, "compute_s": compute_s, "steps": steps,
                      "sync_s": sync_s}))


if __name__ == "__main__":
    main()
