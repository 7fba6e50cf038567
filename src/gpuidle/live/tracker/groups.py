"""This rank's process groups, read from torch.distributed as its profiler records them (``pg_config``): what
tells the rank's place in a job's mesh (``analysis.mesh``)."""

from __future__ import annotations

from typing import Any

GROUPS_NOT_READ = ("process groups not read ({why}): each rank's place in the job's mesh (tensor, pipeline, "
                   "data parallel) is not told")


def rank_groups(rank: int, world: int) -> tuple[list[dict[str, Any]], str | None]:
    """The groups ``rank`` belongs to (``pg_name``, ``pg_desc``, ``pg_size``, ``ranks``; no ranks for a group of
    the whole world, whose list every rank would send every other), and a note where torch does not say (its
    private registry moved, or a backend failed to describe itself). Groups made after this call are not among
    them."""
    try:
        from torch.distributed import distributed_c10d

        configs = distributed_c10d._get_all_pg_configs()
    except Exception as e:  # a private API: whatever it raises, the user's job goes on
        return [], GROUPS_NOT_READ.format(why=f"{type(e).__name__}: {e}"[:120])
    mine = []
    for c in configs:
        ranks = c.get("ranks")
        if isinstance(ranks, list) and rank in ranks:
            mine.append({"pg_name": str(c.get("pg_name", "")), "pg_desc": str(c.get("pg_desc", "")),
                         "pg_size": len(ranks), "ranks": [int(r) for r in ranks] if len(ranks) < world else []})
    return mine, None
