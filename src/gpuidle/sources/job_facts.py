"""What a trace states about its job, believed only as far as it holds together.

A profiler writes the world size, the rank and each process group's size and ranks as the program told it; a
damaged or hand-edited trace can claim anything. Every reader passes its :class:`~gpuidle.model.TraceMeta`
through :func:`check_job_facts` once, and the tracker's log header goes through :func:`checked_facts`: a world
beyond any job, a rank outside its world, a group larger than the world, a group's rank outside the world or
listed twice, a size its rank list contradicts are set aside, each kind named in one note, so that nothing later
is sized from a claimed number alone.
"""

from __future__ import annotations

import math
from typing import Any

from gpuidle.model import TraceMeta

MAX_WORLD = 1 << 18
"""More ranks than any job runs (262,144; the largest training clusters hold some 200,000 GPUs): a world
claimed beyond it is a damaged field, not a job."""
SHOWN = 3
"""Reasons named in a note before the rest are counted."""


def _count(value: Any) -> int | None:
    """An int (not a bool), or None."""
    return value if type(value) is int else None


def _short(value: Any) -> str:
    """``value`` as a note can hold it: an integer past 12 digits by its size (``2**1000``'s digits are too many
    for Python to print), anything else cut at 40 characters."""
    if type(value) is int and abs(value) >= 10**12:
        return f"a {int(abs(value).bit_length() * math.log10(2)) + 1}-digit number"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_job_facts(meta: TraceMeta, largest_group: int | None = None) -> None:
    """``meta``'s world size, rank and process groups checked against each other and against :data:`MAX_WORLD`;
    ``largest_group``: the most ranks one of the trace's collective calls names. What does not hold is dropped
    from ``meta`` and named in its notes."""
    meta.world_size, meta.process_groups, notes = checked_facts(meta.rank, meta.world_size, meta.process_groups,
                                                                largest_group)
    meta.notes.extend(notes)


def checked_facts(rank: int | None, world: int | None, groups: list[dict[str, Any]],
                  largest_group: int | None = None) -> tuple[int | None, list[dict[str, Any]], list[str]]:
    """The world size (None where set aside) and the process groups that hold together with ``rank``, each other
    and the largest group a collective call names, and one note per kind of claim set aside."""
    notes = []
    if world is not None and not 1 <= world <= MAX_WORLD:
        notes.append(f"the trace's world size {_short(world)} is more ranks than any job runs (over {MAX_WORLD:,}): "
                     "set aside; the job is the traces given")
        world = None
    if rank is not None and world is not None and not 0 <= rank < world:
        notes.append(f"rank {_short(rank)} lies outside the trace's world of {world}: the world size is set aside")
        world = None
    if largest_group is not None and world is not None and largest_group > world:
        notes.append(f"a collective of {_short(largest_group)} ranks is larger than the trace's world of {world}: "
                     "the world size is set aside")
        world = None
    kept: list[dict[str, Any]] = []
    why: dict[str, int] = {}
    for group in groups:
        reason = _group_fault(group, world)
        if reason is None:
            kept.append(group)
        else:
            name = _short(str(group.get("pg_desc") or group.get("pg_name") or "unnamed"))
            key = f"{name}: {reason}"
            why[key] = why.get(key, 0) + 1
    if why:
        shown = [k + (f" ({n} groups)" if n > 1 else "") for k, n in list(why.items())[:SHOWN]]
        more = f"; {len(why) - SHOWN} other reason(s)" if len(why) > SHOWN else ""
        notes.append(f"{len(groups) - len(kept)} process group(s) of {len(groups)} set aside (pg_config): "
                     + "; ".join(shown) + more)
    return world, kept, notes


def _group_fault(group: dict[str, Any], world: int | None) -> str | None:
    """Why ``group`` (one ``pg_config`` entry) cannot be believed, or None."""
    limit = world or MAX_WORLD
    raw = group.get("pg_size", group.get("group_size"))
    size = _count(raw)
    if raw is not None and (size is None or not 1 <= size <= limit):
        too_many = size is not None and size > limit
        return f"its size ({_short(raw)}) " + (("is larger than the world of " + str(world) if world else
                                                "is more ranks than any job runs") if too_many else
                                               "is not a count of ranks")
    ranks = group.get("ranks")
    if ranks is None or ranks == []:
        return None
    if not isinstance(ranks, list) or len(ranks) > limit or any(_count(r) is None for r in ranks):
        return "its ranks are not a list of rank numbers"
    outside = [r for r in ranks if not 0 <= r < limit]
    if outside:
        return f"rank {_short(outside[0])} lies outside " + (f"the world of {world}" if world else "any job")
    if len(set(ranks)) != len(ranks):
        return "a rank is listed twice"
    if size is not None and size != len(ranks):
        return f"its size is {size} but it lists {len(ranks)} ranks"
    return None
