"""The one what-if model every gain comes from.

Per rank, a steady-state step (the mean over the steps not marked ``excluded``) is its
busy time plus its idle per cause. A rank's *own* step time is its step less the time it
waited for slower ranks (``straggler_wait``); a synchronous step ends at its collective,
so the job's step time is the slowest rank's own time. A fix removes seconds per step
from pools of one or more ranks: idle of a cause, busy time (compute-side fixes), or a
straggler's excess over its peers part by part. The job step is recomputed from every
rank's remaining parts, so a fix on a rank that does not set the pace saves nothing until
the rank that does is fixed, and then its full value.

A fix that removes what the input measured is a point; one whose saving rests on an
assumption carries the assumption's two ends (:attr:`Effect.low`, :attr:`Effect.high`, as
factors of its nominal effect) and its gain is a range. Fixes drawing on the same pool
(rank, cause) share it: the best carries the gain, the others are its alternatives. The
others are applied in ranked order, each chosen for the largest saving *at its low end*
after the fixes above it (then the higher confidence): a certain saving ranks above a
larger assumed one. ``combined`` is the last link of that chain, never more than the idle
and compute the fixes remove.

Where the ranks cannot be put side by side (a rank missing from the job, a rank with no
steps, ranks that disagree on the steps they cover), no job-level figure is given: each
gain is its rank's own step time saved (``scope="rank"``) and the job's notes say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec
import numpy as np

from gpuidle.analysis.steps import counted
from gpuidle.model import Cause, Combined, Gain, JobReport, RankReport, Recommendation
from gpuidle.model.arrays import median_of

MINOR_SHARE = 0.005
"""A fix saving less than 0.5 % of a step stays in the JSON but leaves the terminal's top list."""
_CONFIDENCE = {"high": 0, "medium": 1, "low": 2}
UTILIZATION_TOLERANCE = 1e-9
"""Two utilizations computed by different sums of the same seconds differ by rounding, not by a fall."""
TIE_SHARE = 0.01
"""Savings within 1 % of the step of each other rank as equal, then by confidence: run-to-run noise in
the measured means (and rounding in their sums) never decides between two fixes."""

Bound = Literal["low", "nominal", "high"]


class Effect(msgspec.Struct, frozen=True):
    """What a fix removes from one rank's steady step, in seconds per step.

    ``idle``: cause -> seconds; ``busy``: compute time; ``pools``: further pools it claims.
    ``low``/``high``: the effect at the two ends of its assumption, as factors of this nominal
    one (both 1 for a measured saving). ``reason`` set: the gain cannot be estimated, and says why.
    ``part``: the part of its causes' idle it draws on (a collective's role); fixes on different
    parts of one cause are not alternatives to each other, though they still share that cause's idle.
    """

    idle: dict[str, float] = msgspec.field(default_factory=dict)
    busy: float = 0.0
    pools: tuple[str, ...] = ()
    reason: str | None = None
    low: float = 1.0
    high: float = 1.0
    part: str | None = None
    """The idle removed is a named part of its cause's idle (a collective's role; ``zero_grad``: the launches
    of per-parameter fills): it shares no pool with fixes that claim the rest of that cause."""
    measured_idle: bool = False
    """The idle is measured and removed whole at every bound; ``low``/``high`` span the busy part alone."""

    def at(self, bound: Bound) -> Effect:
        f = {"low": self.low, "nominal": 1.0, "high": self.high}[bound]
        if f == 1.0:
            return self
        idle = self.idle if self.measured_idle else {c: sec * f for c, sec in self.idle.items()}
        return msgspec.structs.replace(self, idle=idle, busy=self.busy * f)

    @property
    def modelled(self) -> bool:
        return self.low != 1.0 or self.high != 1.0


def modelled(effect: Effect, low: float, high: float) -> Effect:
    """``effect`` as the nominal of a modelled saving whose assumption spans ``low``..``high`` times it."""
    return msgspec.structs.replace(effect, low=low, high=high)


class Proposal(msgspec.Struct):
    """A recommendation before its gain is known, with its effect on each rank it applies to."""

    rec: Recommendation
    effects: dict[int, Effect]


Applied = Sequence[tuple[Proposal, Bound]]


class RankState(msgspec.Struct, frozen=True):
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


def excess(mine: RankState, peers: Sequence[RankState]) -> Effect:
    """A rank's parts above its peers' median of the same part: busy time and each idle cause but the wait,
    each only where it stands above :data:`TIE_SHARE` of the rank's step."""
    if not peers:
        return Effect()
    noise = TIE_SHARE * mine.step_s  # a part that differs by less is run-to-run noise, and claims no pool
    busy = mine.busy_s - float(median_of([p.busy_s for p in peers]))
    idle = {}
    for cause, sec in mine.idle.items():
        if cause == Cause.STRAGGLER_WAIT.value:
            continue
        over = sec - float(median_of([p.idle.get(cause, 0.0) for p in peers]))
        if over > noise:
            idle[cause] = over
    return Effect(idle=idle, busy=busy if busy > noise else 0.0)


class Model(msgspec.Struct):
    ranks: dict[int, RankState]

    def step_s(self, applied: Applied = ()) -> float:
        return max(self.own_after(applied).values(), default=0.0)

    def utilization(self, applied: Applied = ()) -> float:
        t = self.step_s(applied)
        busy = self._left(applied)[1]
        return float(np.mean(list(busy.values()))) / t if t > 0 and busy else 0.0

    def own_after(self, applied: Applied = ()) -> dict[int, float]:
        """Each rank's own step time once ``applied`` are applied, at their bounds."""
        idle, busy = self._left(applied)
        return {r: busy[r] + sum(v for c, v in idle[r].items() if c != Cause.STRAGGLER_WAIT.value)
                + self._rest(r) for r in self.ranks}

    def _rest(self, r: int) -> float:
        """Step time that is neither busy nor an idle cause (zero when the causes add up, as they do)."""
        s = self.ranks[r]
        return s.step_s - s.busy_s - sum(s.idle.values())

    def _left(self, applied: Applied) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
        idle = {r: dict(s.idle) for r, s in self.ranks.items()}
        busy = {r: s.busy_s for r, s in self.ranks.items()}
        for p, bound in applied:
            for r, e in p.effects.items():
                if r not in idle or e.reason is not None:
                    continue
                e = e.at(bound)
                for cause, sec in e.idle.items():
                    idle[r][cause] = max(0.0, idle[r].get(cause, 0.0) - sec)
                busy[r] = max(0.0, busy[r] - e.busy)
        return idle, busy

    def limit(self, applied: Applied = ()) -> tuple[int, str, float]:
        """The rank that sets the step afterwards, its largest remaining idle cause and its seconds."""
        own = self.own_after(applied)
        if not own:
            return 0, "none", 0.0
        r = max(own, key=lambda k: (own[k], -k))
        left = dict(self._left(applied)[0][r])
        left.pop(Cause.STRAGGLER_WAIT.value, None)
        cause = max(left, key=lambda k: left[k], default="none")
        return r, cause, left.get(cause, 0.0)


def _pools(p: Proposal) -> set[tuple[int, str]]:
    out = set()
    for r, e in p.effects.items():
        out |= {(r, c if e.part is None else f"{c}:{e.part}") for c, sec in e.idle.items() if sec > 0}
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
    shares = [(e.idle[comm] / model.ranks[r].idle[comm], e) for r, e in p.effects.items()
              if r in model.ranks and model.ranks[r].idle.get(comm, 0.0) > 0 and comm in e.idle]
    if p.rec.cause != comm or not shares:
        return p
    share, like = min(shares, key=lambda se: se[0])
    for r, state in model.ranks.items():
        if r not in p.effects and state.idle.get(comm, 0.0) > 0:
            p.effects[r] = msgspec.structs.replace(like, idle={comm: share * state.idle[comm]}, busy=0.0, pools=())
    return p


def _estimable(p: Proposal) -> bool:
    return all(e.reason is None for e in p.effects.values())


def _claimed(p: Proposal) -> float:
    """What a fix whose gain is not estimable claims of a step at its low end (the idle of the one step measured),
    on the rank where it claims most: such fixes are listed in this order, the rank order kept between equals."""
    return max((sum(e.at("low").idle.values()) + e.at("low").busy for e in p.effects.values()), default=0.0)


def _is_modelled(p: Proposal) -> bool:
    return any(e.modelled for e in p.effects.values())


def job_problem(reports: Sequence[RankReport], job: JobReport | None) -> str | None:
    """Why the ranks cannot be put side by side in one job step, or None when they can."""
    if job is None or len(reports) < 2:
        return None
    empty = sorted(r.rank for r in reports if not r.steps)
    if empty:
        return f"rank {', '.join(map(str, empty))} has no steps"
    if job.missing_ranks:
        few = ", ".join(map(str, job.missing_ranks[:8])) + (" …" if job.missing_count() > 8 else "")
        return f"{job.missing_count()} rank(s) missing from the input ({few}): any of them may set the pace"
    counts = {r.rank: len(r.steps) for r in reports}
    if len(set(counts.values())) > 1:
        most = max(counts.values())
        short = sorted(r for r, n in counts.items() if n != most)
        return (f"the ranks cover different steps (rank {short[0]}: {counts[short[0]]} steps, "
                f"others {most}): their steps cannot be matched")
    return None


def plan(proposals: Sequence[Proposal], reports: Sequence[RankReport], include_all: bool = False,
         job: JobReport | None = None) -> tuple[list[Recommendation], Combined | None]:
    """Every recommendation with its gain, in the order to apply them, and the combined result."""
    problem = job_problem(reports, job)
    if problem is not None and job is not None:
        job.notes.append(f"what-if: no job-level figure, {problem}; each gain is its rank's own step time saved")
        return _per_rank(proposals, reports, include_all, problem), None
    model = Model({r.rank: rank_state(r, include_all) for r in reports if r.steps})
    merged = [_job_wide(p, model) for p in merge(proposals)]
    return _chain(merged, model)


def _chain(merged: list[Proposal], model: Model) -> tuple[list[Recommendation], Combined | None]:
    t0, u0 = model.step_s(), model.utilization()
    alone = {p.rec.id: _saved(model, [], p) for p in merged}

    primaries, alternatives = _group(merged, alone, t0)
    applied: list[tuple[Proposal, Bound]] = []
    order: list[Proposal] = []
    todo = [p for p in primaries if _estimable(p)]
    while todo:
        marg = {p.rec.id: _saved(model, applied, p) for p in todo}
        best = _best(todo, marg, t0)
        _set_gain(best, model, t0, u0, alone[best.rec.id], marg[best.rec.id], [q for q, _ in applied])
        applied.append((best, "nominal"))
        order.append(best)
        todo.remove(best)
    for p in sorted((p for p in primaries if not _estimable(p)), key=_claimed, reverse=True):
        _not_estimable(p, t0, u0)
        order.append(p)
    for alts in alternatives.values():
        for a in alts:
            _set_gain(a, model, t0, u0, alone[a.rec.id], None, [])
    out = _with_alternatives(order, alternatives)
    if not model.ranks:
        return out, None
    return out, _combined(model, [p for p, _ in applied], t0)


def _group(proposals: Sequence[Proposal], saved: dict[str, tuple[float, float, float] | None],
           step_s: float) -> tuple[list[Proposal], dict[str, list[Proposal]]]:
    """The fixes that carry their pools' gain, in rank order, and per fix the alternatives claiming its pools."""
    primaries: list[Proposal] = []
    alternatives: dict[str, list[Proposal]] = {}
    for p in _causes_before_symptoms(ranked(proposals, saved, step_s)):
        claim = _pools(p)
        owner = next((q for q in primaries if claim & _pools(q)), None) if _estimable(p) else None
        if owner is None:
            primaries.append(p)
        else:
            alternatives.setdefault(owner.rec.id, []).append(p)
    return primaries, alternatives


def _causes_before_symptoms(order: list[Proposal]) -> list[Proposal]:
    """``order`` with each straggler after the fix of the cause that makes it late (its data wait, its host
    work) on that rank: the cause's fix owns the pool and the straggler is its alternative, whichever saves more
    by a few noisy milliseconds (the lateness holds the cause and the jitter of a busy host)."""
    out = list(order)
    for p in order:
        if p.rec.cause != Cause.STRAGGLER_WAIT.value:
            continue
        named = {(r, c) for r, e in p.effects.items() for c in e.pools}
        cause = next((q for q in out if q.rec.cause != Cause.STRAGGLER_WAIT.value and _estimable(q)
                      and _pools(q) & named), None)
        if cause is not None and out.index(cause) > out.index(p):
            out.remove(cause)
            out.insert(out.index(p), cause)
    return out


def _with_alternatives(order: Sequence[Proposal], alternatives: dict[str, list[Proposal]]) -> list[Recommendation]:
    """The recommendations in ``order``, each followed by its alternatives."""
    out: list[Recommendation] = []
    for p in order:
        out.append(p.rec)
        for a in alternatives.get(p.rec.id, []):
            a.rec.alternative_to = p.rec.id
            out.append(a.rec)
    return out


def _best(candidates: Sequence[Proposal], saved: dict[str, tuple[float, float, float] | None],
          step_s: float) -> Proposal:
    """The fix to rank next: of those whose low end is within :data:`TIE_SHARE` of the step of the largest,
    the most confident, then the largest nominal; the estimable before the rest."""
    def low(p: Proposal) -> float:
        s = saved.get(p.rec.id)
        return s[0] if s is not None else -1.0

    top = max(low(p) for p in candidates)
    near = [p for p in candidates if low(p) >= top - TIE_SHARE * step_s]
    return min(near, key=lambda p: (_CONFIDENCE.get(p.rec.confidence, 3),
                                    -(saved.get(p.rec.id) or (0.0, 0.0, 0.0))[1], p.rec.id))


def ranked(proposals: Sequence[Proposal], saved: dict[str, tuple[float, float, float] | None],
           step_s: float) -> list[Proposal]:
    """``proposals`` in rank order, each chosen by :func:`_best` among those left."""
    left, out = list(proposals), []
    while left:
        best = _best(left, saved, step_s)
        out.append(best)
        left.remove(best)
    return out


def _saved(model: Model, applied: Applied, p: Proposal) -> tuple[float, float, float] | None:
    """Step time ``p`` saves after ``applied``, at its low, nominal and high bound; None: not estimable."""
    if not _estimable(p):
        return None
    now = model.step_s(applied)
    low, mid, high = (now - model.step_s([*applied, (p, b)]) for b in ("low", "nominal", "high"))
    return min(low, mid), mid, max(high, mid)


def _combined(model: Model, fixes: list[Proposal], t0: float) -> Combined:
    t1 = model.step_s([(p, "nominal") for p in fixes])
    r, cause, sec = model.limit([(p, "nominal") for p in fixes])
    where = f" on rank {r}" if len(model.ranks) > 1 else ""
    limit = f"{cause}{where}: {sec * 1e3:.2f} ms/step of idle left" if sec > 0 else f"compute{where}"
    low = t0 - model.step_s([(p, "low") for p in fixes])
    high = t0 - model.step_s([(p, "high") for p in fixes])
    return Combined(step_s_before=t0, step_s_saved=t0 - t1, step_s_after=t1,
                    utilization_after=model.utilization([(p, "nominal") for p in fixes]),
                    fixes=[p.rec.id for p in fixes], limit=limit,
                    step_s_saved_low=min(low, t0 - t1), step_s_saved_high=max(high, t0 - t1))


def _per_rank(proposals: Sequence[Proposal], reports: Sequence[RankReport], include_all: bool,
              problem: str) -> list[Recommendation]:
    """Each fix on its own rank's step alone: the figures that stay true when the job's cannot be given."""
    states = {r.rank: rank_state(r, include_all) for r in reports if r.steps}
    saved_by: dict[str, tuple[float, float, float] | None] = {}
    merged = merge(proposals)
    for p in merged:
        ranks = [r for r in p.effects if r in states]
        if not _estimable(p) or not ranks:
            _not_estimable(p, None, None, None if ranks else f"no job-level figure: {problem}")
            saved_by[p.rec.id] = None
        else:
            on_rank = {r: _saved(Model({r: states[r]}), [], p) for r in ranks}
            best = max(ranks, key=lambda r: (on_rank[r] or (0.0, 0.0, 0.0))[1])
            model = Model({best: states[best]})
            saved_by[p.rec.id] = on_rank[best]
            _set_gain(p, model, model.step_s(), model.utilization(), saved_by[p.rec.id], None, [])
            p.rec.gain.reason = p.rec.gain.reason or f"rank {best}'s own step; no job-level figure: {problem}"
        p.rec.gain.scope = "rank"
    step = max((s.step_s for s in states.values()), default=0.0)
    return _with_alternatives(*_group(merged, saved_by, step))


def _not_estimable(p: Proposal, t0: float | None, u0: float | None, why: str | None = None) -> None:
    reason = why or next(e.reason for e in p.effects.values() if e.reason is not None)
    p.rec.gain = Gain(step_s_saved=None, utilization_after=None, utilization_before=u0, step_s_before=t0,
                      reason=reason, basis="modelled" if _is_modelled(p) else "measured")


def _set_gain(p: Proposal, model: Model, t0: float, u0: float, saved: tuple[float, float, float] | None,
              marginal: tuple[float, float, float] | None, before: list[Proposal]) -> None:
    mine: Applied = [(p, "nominal")]
    after_t = model.step_s(mine)
    util = model.utilization(mine)
    low, mid, high = saved if saved is not None else (None, None, None)
    after_mid = marginal[1] if marginal is not None else None
    reason = None
    after_id = None
    if after_mid is not None and mid is not None and mid < MINOR_SHARE * t0 < after_mid and before:
        prev = before[-1]
        r = model.limit([(q, "nominal") for q in before])[0]
        after_id = prev.rec.id
        reason = (f"after {prev.rec.id}" + (f" on rank {prev.rec.rank}" if prev.rec.rank is not None else "")
                  + f", {p.rec.cause} on rank {r} limits the step: {after_mid * 1e3:.2f} ms")
    elif util < u0 - UTILIZATION_TOLERANCE:
        r, cause, sec = model.limit(mine)
        was, now = _distinct_percents(u0, util)
        reason = (f"utilization over the steady steps falls from {was} % to {now} %: "
                  "the step gets shorter, the idle stays"
                  + (f" ({cause} {sec * 1e3:.2f} ms/step is next)" if sec > 0 else ""))
    is_modelled = _is_modelled(p)
    assumption = p.rec.evidence.get("assumption") if is_modelled else None
    p.rec.gain = Gain(
        step_s_saved=mid, utilization_after=util, utilization_before=u0, step_s_before=t0, step_s_after=after_t,
        speedup=t0 / after_t if after_t > 0 else None, reason=reason, after=after_id,
        step_s_saved_after=after_mid, step_s_saved_low=low, step_s_saved_high=high,
        basis="modelled" if is_modelled else "measured",
        assumption=str(assumption) if assumption is not None else None,
    )
    p.rec.gain.minor = mid is not None and max(mid, after_mid or 0.0) < MINOR_SHARE * t0


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
