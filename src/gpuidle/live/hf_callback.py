"""A Hugging Face ``transformers`` ``TrainerCallback`` that drives the step tracker: one tracker
step per optimizer step.

>>> from gpuidle.torch import GpuidleTrainerCallback                # doctest: +SKIP
>>> trainer = Trainer(..., callbacks=[GpuidleTrainerCallback("gpuidle-run")])  # doctest: +SKIP

The Trainer fetches all the micro-batches of an optimizer step before ``on_step_begin``: the
time from the previous step's end (or its logging) to then is *data wait*. The phases are
*forward_backward* (every micro-batch, to ``on_pre_optimizer_step``) and *optimizer* (step,
scheduler, ``zero_grad``, to ``on_step_end``). Logging after a step is host time of its
own; evaluation and checkpoints are no step's time. Samples per step come from the
arguments (``per_device_train_batch_size`` × ``gradient_accumulation_steps``). The Trainer
does not hand callbacks its DDP model, so communication is not timed here.
"""

from __future__ import annotations

from typing import Any

from gpuidle.errors import GpuidleError
from gpuidle.live.tracker import StepTracker

try:
    from transformers import TrainerCallback
except ImportError:
    raise GpuidleError("the Trainer callback needs transformers", "pip install 'gpuidle[transformers]'") from None

PHASES = ("forward_backward", "optimizer")


class GpuidleTrainerCallback(TrainerCallback):
    """Times every optimizer step of a ``transformers.Trainer`` with a :class:`StepTracker`.

    :param out_dir: the tracker's output folder.
    :param tracker_options: passed to :class:`StepTracker` (``every``, ``log_every``, ``nvtx``, ...).
    """

    def __init__(self, out_dir: str = "gpuidle-run", **tracker_options: Any) -> None:
        self.out_dir = out_dir
        self.options = {"phases": PHASES, "compute_phases": PHASES, **tracker_options}
        self.tracker: StepTracker | None = None
        self._since: int | None = None
        self._samples = 0
        self._batches = 1

    def _mark(self) -> None:
        if self.tracker is not None:
            self._since = self.tracker.clock()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker = StepTracker(self.out_dir, **self.options)
        self._batches = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        self._samples = int(getattr(args, "per_device_train_batch_size", 0) or 0) * self._batches
        self._mark()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        t = self.tracker
        if t is None:
            return
        waited = t.clock() - self._since if self._since is not None else 0
        t.add_data_wait(waited, samples=self._samples, batches=self._batches)
        t.begin("forward_backward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.end("forward_backward")
            self.tracker.begin("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.step()
            self._mark()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        t = self.tracker
        if t is not None and self._since is not None:
            now = t.clock()
            t.add_time("logging", now - self._since)
            self._since = now

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()

    def _restart(self) -> None:
        if self.tracker is not None:
            self.tracker.restart()
            self._mark()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.close()
