"""What every rule reads: one rank's report, its steady-state step, and the questions rules keep asking of it.

Rules (``advice.rules``, ``advice.comm_rules``) are functions of a :class:`RuleInput`; the
effect they propose is computed by the what-if model, never here.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuidle.advice.hardware import Hardware, hardware
from gpuidle.advice.whatif import Effect, Proposal, RankState, modelled, placeholder
from gpuidle.analysis.steps import counted
from gpuidle.model import Cause, DeviceReport, RankReport, Recommendation, StepReport

MIB = 1 << 20
COMPUTE = "compute"
"""The ``cause`` of a recommendation that shortens busy time rather than idle time."""


class RuleInput(msgspec.Struct, frozen=True):
    """One rank's report, its steady-state step, and what the rules keep asking of it."""

    report: RankReport
    device: DeviceReport
    """The device with the most busy time: the one the rank trains on."""
    state: RankState
    """The mean steady-state step (steps marked ``excluded`` left out)."""
    steps: int
    """Steady steps the state is the mean of."""
    accumulation_repeats: int
    """How many times the same all-reduce sequence repeats inside a step (1: no repeat)."""
    include_all: bool = False

    @property
    def hw(self) -> Hardware:
        return hardware(self.device)

    def idle(self, cause: Cause) -> float:
        """Idle of ``cause`` per steady step, in seconds."""
        return self.state.idle.get(cause.value, 0.0)

    def share(self, cause: Cause) -> float:
        return self.idle(cause) / self.state.step_s if self.state.step_s else 0.0

    def mean_step(self, value: Callable[[StepReport], float]) -> float:
        """A per-step figure averaged over the steady steps the state is built from."""
        steps = counted(self.report.steps, self.include_all)
        return sum(value(s) for s in steps) / len(steps) if steps else 0.0

    def exposed(self, kinds: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None) -> float:
        """Exposed communication per steady step from the collectives of ``kinds`` moving ``dtypes`` (None: any);
        a report that does not split it (step timing) counts all of it as ``unknown:unknown``."""
        def pick(s: StepReport) -> float:
            split = s.exposed_comm_s or {"unknown:unknown": s.idle_by_cause_s.get(Cause.COMMUNICATION.value, 0.0)}
            return sum(v for k, v in split.items()
                       if (kinds is None or k.partition(":")[0] in kinds)
                       and (dtypes is None or k.partition(":")[2] in dtypes))
        return self.mean_step(pick)

    @property
    def inference(self) -> bool:
        return self.report.workload is not None and self.report.workload.mode == "inference"

    @property
    def python_stacks(self) -> bool:
        """The trace holds Python stacks (``with_stack=True``): asking for them again would be wrong."""
        ev = self.report.host_events or {}
        return ev.get("python_functions", 0) > 0

    def per_window_step(self, seconds: float) -> float:
        """A whole-window figure (kernel totals) per step of the window."""
        return seconds / max(len(self.report.steps), 1)

    def rec(self, id: str, cause: Cause | str, title: str, evidence: dict[str, object], fix: str,
            effect: Effect, confidence: str = "high") -> Proposal:
        """A fix on this rank. High confidence is a measured saving, a point: a modelled one (a range over its
        assumption, even beside measured idle) is at most medium, whatever the rule asked."""
        if confidence == "high" and effect.modelled:
            confidence = "medium"
        evidence = {"device": self.device.device, "steps": self.steps, **evidence}
        rec = Recommendation(id=id, cause=str(cause), title=title, evidence=evidence, fix=fix,
                             gain=placeholder(), confidence=confidence, rank=self.report.rank)
        return Proposal(rec, {self.report.rank: effect})


def removes(cause: Cause, seconds: float) -> Effect:
    return Effect(idle={cause.value: seconds})


Rule = Callable[[RuleInput], list[Proposal]]
MIN_SHARE = 0.03
"""A cause below 3 % of the window is not worth a recommendation."""


def removes_between(low: float, high: float, idle: dict[Cause, float] | None = None, busy: float = 0.0,
                    part: str | None = None, pools: tuple[str, ...] = ()) -> Effect:
    """A modelled saving: between ``low`` and ``high`` times these seconds go; the nominal is the middle (a
    point when the two are equal). ``part``/``pools``: as :class:`~gpuidle.advice.whatif.Effect`'s."""
    mid = (low + high) / 2
    if mid <= 0:
        return Effect(reason="no saving at either bound")
    effect = Effect(idle={c.value: sec * mid for c, sec in (idle or {}).items()}, busy=busy * mid, part=part,
                    pools=pools)
    return modelled(effect, low / mid, high / mid) if low != high else effect


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)
