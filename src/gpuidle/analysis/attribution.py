"""One rank's windows, start-up and idle by cause: the one preparation the report and the annotated trace share.

The report (:func:`~gpuidle.analysis.summary.summarize_rank`) and the annotated trace and HTML timeline
(:func:`gpuidle.api.idle_timeline`) both start here, so that each device's idle in the one equals its idle in the
other: the same names, launches, step window, each device's own window where the devices run their steps apart
(:attr:`~gpuidle.model.Timeline.device_steps`), and the same one-time start-up set apart.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.idle import DeviceIdle, attribute_idle
from gpuidle.analysis.links import launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.startup import Startup, find_startup
from gpuidle.analysis.steps import StepWindow, device_windows, step_window
from gpuidle.model import I64, Timeline


class Attributed(NamedTuple):
    names: NameClasses
    launchers: I64
    window: StepWindow
    """The rank's window: its steps, or the busiest device's where the devices run theirs apart."""
    windows: dict[int, StepWindow]
    """Each device's own window, where the devices run their steps apart; empty where :attr:`window` holds for all."""
    startup: Startup
    idle: list[DeviceIdle]
    """Every device's idle by cause, each over :meth:`window_of` its device."""

    def window_of(self, device: int) -> StepWindow:
        """The window ``device``'s figures are over: its own, else the rank's."""
        return self.windows.get(device, self.window)


def attributed(tl: Timeline, straggler: dict[int, iv.Intervals] | None = None) -> Attributed:
    """The rank's windows, start-up and every device's idle; ``straggler``: per device, the intervals spent waiting
    for a slower rank (from the job's other ranks), charged to ``straggler_wait``."""
    names = NameClasses.of(tl.strings)
    launchers = launcher_rows(tl)
    window = step_window(tl, names, launchers)
    windows = device_windows(tl, names, launchers)
    startup = find_startup(tl, names, window, launchers)
    idle = attribute_idle(tl, names, window, launchers, straggler, startup=startup.ranges(), windows=windows)
    return Attributed(names, launchers, window, windows, startup, idle)
