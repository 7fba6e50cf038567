"""A PyTorch Lightning callback that drives the step tracker: one tracker step per training batch.

>>> from gpuidle.torch import GpuidleLightningCallback              # doctest: +SKIP
>>> trainer = lightning.Trainer(callbacks=[GpuidleLightningCallback("gpuidle-run")])  # doctest: +SKIP

Lightning's hooks bound the phases: *data wait* runs from the end of a batch (or the start
of an epoch) to the start of the next, which is when Lightning fetches the batch and moves
it to the device, so host-to-device copies count here; *forward* from the batch start to
``on_before_backward`` (``training_step``, ``zero_grad``); *backward* to ``on_after_backward``;
*optimizer* to the batch end. Validation between batches is no step's time. Under the DDP
strategy the model's communication is timed too, unless it already has a comm hook.
"""

from __future__ import annotations

from typing import Any

from gpuidle.errors import GpuidleError
from gpuidle.live.tracker import StepTracker, batch_size

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment, unused-ignore]  # where lightning is
    except ImportError:
        raise GpuidleError("the Lightning callback needs PyTorch Lightning",
                           "pip install 'gpuidle[lightning]'") from None


class GpuidleLightningCallback(Callback):
    """Times every training batch with a :class:`~gpuidle.live.tracker.StepTracker`.

    :param out_dir: the tracker's output folder.
    :param tracker_options: passed to :class:`StepTracker` (``every``, ``log_every``, ``nvtx``, ...).
    """

    def __init__(self, out_dir: str = "gpuidle-run", **tracker_options: Any) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.options = tracker_options
        self.tracker: StepTracker | None = None
        self._since: int | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        import torch

        self.tracker = StepTracker(self.out_dir, **self.options)
        model = getattr(trainer.strategy, "model", None)
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not getattr(model, "_comm_hooks", None):
            self.tracker.watch_ddp(model)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.restart()
            self._since = self.tracker.clock()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        t = self.tracker
        if t is None:
            return
        now = t.clock()
        t.add_data_wait(now - self._since if self._since is not None else 0, samples=batch_size(batch))
        t.begin("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.tracker is not None:
            self.tracker.end("forward")
            self.tracker.begin("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.end("backward")
            self.tracker.begin("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.tracker is not None:
            self.tracker.step()
            self._since = self.tracker.clock()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.restart()
            self._since = self.tracker.clock()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(type(exception), exception, exception.__traceback__)
