"""The one what-if model every gain comes from.

Per rank, a steady-state step (the mean over the steps not marked ``excluded``) is its
busy time plus its idle per cause. A rank's *own* step time is its step less the time it
waited for slower ranks (``straggler_wait``); the job's step time is the slowest rank's
own time, so it includes that rank's exposed communication. A fix removes seconds per
step from pools of one or more ranks: idle of a cause, busy time (compute-side fixes),
or a straggler's excess. Its gain is the job step time before less after, so a fix on a
rank that does not set the pace saves nothing until the rank that does is fixed.

Fixes drawing on the same pool (rank, cause) share it: the best carries the gain, the
others are its alternatives. The fixes that are not alternatives are applied greedily,
largest marginal saving first; that is the order of the report, and ``combined`` is the
result of applying them all, never more than the idle and compute they remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuidle.analysis.steps import counted
from gpuidle.model import Cause, Combined, Gain, RankReport, Recommendation

MINOR_SHARE = 0.005
"""A fix saving less than 0.5 % of a step stays in the JSON but leaves the terminal's top list."""
_CONFIDENCE = {"high": 0, "medium": 1, "low": 2}


@dataclass(frozen=True, slots=True)
class Effect:
    """What a fix removes from one rank's steady step, in seconds per step.

    ``idle``: cause -> seconds; ``busy``: compute time; ``own_to``: bring the rank's own step
    time down to this (a straggler fixed to its peers' level); ``pools``: further pools it
    claims. ``reason`` set: the gain cannot be estimated, and says why.
    """

    idle: dict[str, float] = field(default_factory=dict)
    busy: float = 0.0
    own_to: float | None = None
    pools: tuple[str, ...] = ()
    reason: str | None = None
    part: str | None = None
    """The idle removed is a named part of its cause's idle (``zero_grad``: the launches of per-parameter
    fills): it shares no pool with fixes that claim the rest of that cause."""


@dataclass(slots=True)
class Proposal:
    """A recommendation before its gain is known, with its effect on each rank it applies to."""

    rec: Recommendation
    effects: dict[int, Effect]


@dataclass(frozen=True, slots=True)
class RankState:
    rank: int
    step_s: float
    busy_s: float
    idle: dict[str, float]

    @property
    def own_s(self) -> float:
        return self.step_s - self.idle.get(Cause.STRAGGLER_WAIT.value, 0.0)


def rank_state(r: RankReport, include_all: bool = False) -> RankState:
    """The mean steady-state step of a rank's primary device."""
    steps = counted(r.steps, include_all)
    n = max(len(steps), 1)
    idle = {k: sum(s.idle_by_cause_s[k] for s in steps) / n for k in r.steps[0].idle_by_cause_s} if steps else {}
    return RankState(r.rank, sum(s.dur_s for s in steps) / n, sum(s.busy_s for s in steps) / n, idle)


@dataclass(slots=True)
class Model:
    ranks: dict[int, RankState]

    def step_s(self, applied: Sequence[Proposal] = ()) -> float:
        return max(self._own_after(applied).values(), default=0.0)

    def utilization(self, applied: Sequence[Proposal] = ()) -> float:
        t = self.step_s(applied)
        busy = self._busy_after(applied)
        return float(np.mean(list(busy.values()))) / t if t > 0 and busy else 0.0

    def _own_after(self, applied: Sequence[Proposal]) -> dict[int, float]:
        own = {r: s.own_s for r, s in self.ranks.items()}
        left = {r: dict(s.idle) for r, s in self.ranks.items()}
        busy = {r: s.busy_s for r, s in self.ranks.items()}
        for p in applied:
            for r, e in p.effects.items():
                if r not in own or e.reason is not None:
                    continue
                for cause, sec in e.idle.items():
                    take = min(sec, left[r].get(cause, 0.0))
                    left[r][cause] = left[r].get(cause, 0.0) - take
                    own[r] -= take
                take = min(e.busy, busy[r])
                busy[r] -= take
                own[r] -= take
                if e.own_to is not None:
                    own[r] = min(own[r], e.own_to)
        return own

    def _busy_after(self, applied: Sequence[Proposal]) -> dict[int, float]:
        busy = {r: s.busy_s for r, s in self.ranks.items()}
        for p in applied:
            for r, e in p.effects.items():
                if r in busy and e.reason is None:
                    busy[r] = max(0.0, busy[r] - e.busy)
        return busy

    def limit(self, applied: Sequence[Proposal] = ()) -> tuple[int, str, float]:
        """The rank that sets the step afterwards, its largest remaining idle cause and its seconds."""
        own = self._own_after(applied)
        if not own:
            return 0, "none", 0.0
        r = max(own, key=lambda k: (own[k], -k))
        left = dict(self.ranks[r].idle)
        left.pop(Cause.STRAGGLER_WAIT.value, None)
        for p in applied:
            e = p.effects.get(r)
            if e is not None and e.reason is None:
                for cause, sec in e.idle.items():
                    left[cause] = max(0.0, left.get(cause, 0.0) - sec)
        cause = max(left, key=lambda k: left[k], default="none")
        return r, cause, left.get(cause, 0.0)


def _pools(p: Proposal) -> set[tuple[int, str]]:
    out = set()
    for r, e in p.effects.items():
        out |= {(r, f"{c}:{e.part}" if e.part else c) for c, sec in e.idle.items() if sec > 0}
        out |= {(r, c) for c in e.pools}
    return out


def merge(proposals: Sequence[Proposal]) -> list[Proposal]:
    """One proposal per fix id: its effects on every rank it fired on; the text of the rank it gains most on."""
    out: dict[str, Proposal] = {}
    weight: dict[str, float] = {}
    for p in proposals:
        w = sum(sum(e.idle.values()) + e.busy for e in p.effects.values())
        if p.rec.id not in out:
            out[p.rec.id] = Proposal(p.rec, dict(p.effects))
            weight[p.rec.id] = w
            continue
        m = out[p.rec.id]
        m.effects.update(p.effects)
        if w > weight[p.rec.id]:
            m.rec, weight[p.rec.id] = p.rec, w
    for m in out.values():
        if len(m.effects) > 1:
            m.rec.evidence["ranks"] = sorted(m.effects)
    return list(out.values())


def _job_wide(p: Proposal, model: Model) -> Proposal:
    """A collective is one operation on every rank: a fix that shortens it removes the same share of
    exposed communication on the ranks it did not fire on."""
    comm = Cause.COMMUNICATION.value
    shares = [e.idle[comm] / model.ranks[r].idle[comm] for r, e in p.effects.items()
              if r in model.ranks and model.ranks[r].idle.get(comm, 0.0) > 0 and comm in e.idle]
    if p.rec.cause != comm or not shares:
        return p
    share = min(shares)
    for r, state in model.ranks.items():
        if r not in p.effects and state.idle.get(comm, 0.0) > 0:
            p.effects[r] = Effect(idle={comm: share * state.idle[comm]})
    return p


def _estimable(p: Proposal) -> bool:
    return all(e.reason is None for e in p.effects.values())


def plan(proposals: Sequence[Proposal], reports: Sequence[RankReport],
         include_all: bool = False) -> tuple[list[Recommendation], Combined | None]:
    """Every recommendation with its gain, in the order to apply them, and the combined result."""
    model = Model({r.rank: rank_state(r, include_all) for r in reports if r.steps})
    merged = [_job_wide(p, model) for p in merge(proposals)]
    t0 = model.step_s()
    u0 = model.utilization()
    alone = {p.rec.id: t0 - model.step_s([p]) if _estimable(p) else None for p in merged}

    def key(p: Proposal) -> tuple[float, int, str]:
        return (-(alone[p.rec.id] or 0.0), _CONFIDENCE.get(p.rec.confidence, 3), p.rec.id)

    primaries: list[Proposal] = []
    alternatives: dict[str, list[Proposal]] = {}
    for p in sorted(merged, key=key):
        claim = _pools(p)
        owner = next((q for q in primaries if claim & _pools(q)), None) if _estimable(p) else None
        if owner is None:
            primaries.append(p)
        else:
            alternatives.setdefault(owner.rec.id, []).append(p)

    applied: list[Proposal] = []
    order: list[Proposal] = []
    todo = [p for p in primaries if _estimable(p)]
    while todo:
        now = model.step_s(applied)
        best = min(todo, key=lambda p: (-(now - model.step_s([*applied, p])), *key(p)))
        marginal = now - model.step_s([*applied, best])
        _set_gain(best, model, t0, u0, alone[best.rec.id], marginal, applied)
        applied.append(best)
        order.append(best)
        todo.remove(best)
    for p in primaries:
        if not _estimable(p):
            reason = next(e.reason for e in p.effects.values() if e.reason is not None)
            p.rec.gain = Gain(step_s_saved=None, utilization_after=None, utilization_before=u0, step_s_before=t0,
                              reason=reason)
            order.append(p)
    out: list[Recommendation] = []
    for p in order:
        out.append(p.rec)
        for a in alternatives.get(p.rec.id, []):
            _set_gain(a, model, t0, u0, alone[a.rec.id], None, [])
            a.rec.alternative_to = p.rec.id
            out.append(a.rec)
    if not model.ranks:
        return out, None
    t1 = model.step_s(applied)
    r, cause, sec = model.limit(applied)
    where = f" on rank {r}" if len(model.ranks) > 1 else ""
    limit = f"{cause}{where}: {sec * 1e3:.2f} ms/step of idle left" if sec > 0 else f"compute{where}"
    combined = Combined(step_s_before=t0, step_s_saved=t0 - t1, step_s_after=t1,
                        utilization_after=model.utilization(applied), fixes=[p.rec.id for p in applied], limit=limit)
    return out, combined


def _set_gain(p: Proposal, model: Model, t0: float, u0: float, saved: float | None, marginal: float | None,
              before: list[Proposal]) -> None:
    after_t = model.step_s([p])
    util = model.utilization([p])
    reason = None
    after_id = None
    if marginal is not None and saved is not None and saved < MINOR_SHARE * t0 < marginal and before:
        prev = before[-1]
        r = model.limit(before)[0]
        after_id = prev.rec.id
        reason = (f"after {prev.rec.id}" + (f" on rank {prev.rec.rank}" if prev.rec.rank is not None else "")
                  + f", {p.rec.cause} on rank {r} limits the step: {marginal * 1e3:.2f} ms")
    elif util < u0 - 1e-9:
        r, cause, sec = model.limit([p])
        was, now = _distinct_percents(u0, util)
        reason = (f"utilization falls from {was} % to {now} %: "
                  "the step gets shorter, the idle stays"
                  + (f" ({cause} {sec * 1e3:.2f} ms/step is next)" if sec > 0 else ""))
    p.rec.gain = Gain(
        step_s_saved=saved, utilization_after=util, utilization_before=u0, step_s_before=t0, step_s_after=after_t,
        speedup=t0 / after_t if after_t > 0 else None, reason=reason, after=after_id,
        step_s_saved_after=marginal,
    )
    p.rec.gain.minor = saved is not None and max(saved, marginal or 0.0) < MINOR_SHARE * t0


def _distinct_percents(a: float, b: float) -> tuple[str, str]:
    """Two shares as percentages with just enough decimals to tell them apart (0.52 % to 0.51 %, not 0.5 % to 0.5 %)."""
    for digits in (1, 2, 3):
        x, y = f"{a * 100:.{digits}f}", f"{b * 100:.{digits}f}"
        if x != y:
            break
    return x, y


def placeholder() -> Gain:
    """The gain of a recommendation before :func:`plan` computes it."""
    return Gain(step_s_saved=None, utilization_after=None, reason="not computed")
