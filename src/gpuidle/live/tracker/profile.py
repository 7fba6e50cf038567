"""A profiled window: ``torch.profiler`` over a few of the tracker's steps, one trace per rank.

The trace splits what step timing leaves unattributed (launch overhead, host syncs, host
work between phases); ``gpuidle analyze`` reads it. Its steps carry the tracker's numbers
(``ProfilerStep#N``) and are left out of the tracker's statistics, as is the step after
the window, where the profiler's shutdown lands.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpuidle.errors import GpuidleError

NO_DEVICE_NOTE = ("profiling without CUDA: the traces will have no device activity, so gpuidle analyze "
                  "cannot read them (a CPU-only trace); profile on a GPU run")


class ProfileWindow:
    """At most one window at a time: set up ahead, stepped with the tracker, stopped after its last step."""

    def __init__(self) -> None:
        self._prof: torch.profiler.profile | None = None
        self.steps = range(0)
        """The tracker's steps the profiler runs in: one warm-up step, then the window."""
        self.running = False
        """A plain attribute: the tracker checks it every step."""

    def start(self, steps: range, current: int, where: Path, rank: int, *,
              record_shapes: bool = False, with_stack: bool = False) -> None:
        """Record ``steps`` (after one warm-up step) into ``where``; the tracker is at step ``current``."""
        if not isinstance(steps, range) or steps.step != 1 or len(steps) == 0:
            raise GpuidleError(f"profile(steps={steps!r})", "give a range of consecutive steps, e.g. range(100, 105)")
        if steps.start <= current:
            raise GpuidleError(f"cannot profile from step {steps.start}: step {current} is already running",
                               "choose steps after the current one")
        if self._prof is not None:
            raise GpuidleError("a profiled window is already set up", "one window at a time")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=len(steps), repeat=1, skip_first=steps.start - 1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(where), worker_name=f"rank{rank}",
                                                                    use_gzip=True),
            record_shapes=record_shapes, with_stack=with_stack,
        )
        prof.step_num = current  # ProfilerStep#N then carries the tracker's step numbers
        prof.start()
        self._prof = prof
        self.running = True
        self.steps = range(steps.start - 1, steps.stop)

    def step(self, done: int) -> None:
        """The tracker has finished ``done`` steps: move the profiler on, and stop it after the window."""
        if self._prof is None:
            return
        self._prof.step()
        if done >= self.steps.stop:
            self.stop()

    def stop(self) -> None:
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
            self.running = False
