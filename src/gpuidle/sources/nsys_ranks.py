"""Which processes of an Nsight Systems export are which rank (the rules in :mod:`gpuidle.sources.nsys`).

A report of several processes says their ranks in an NVTX range (``rank 3``), or, where each process runs NCCL
kernels on GPUs of its own, by its lowest device; a one-process report in its recorded launch environment
(``RANK``, ``SLURM_PROCID``...). Otherwise its processes are read as one rank, and a note says so.
"""

from __future__ import annotations

import re

from gpuidle.model import I64, DeviceOpKind, HostKind
from gpuidle.model.arrays import distinct
from gpuidle.sources.nsys_db import Tables

RANK_NVTX = re.compile(r"\brank\s*[#:=_ ]?\s*(\d+)\b", re.IGNORECASE)
RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK")
WORLD_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE")

Rank = tuple[int | None, list[int], list[str]]
"""A rank number (None: not recorded), its processes, its notes."""


def environment(t: Tables) -> dict[str, str]:
    """The launch environment nsys recorded (``TARGET_INFO_SYSTEM_ENV`` ``DeviceEnvironment``)."""
    table = "TARGET_INFO_SYSTEM_ENV"
    if t.pick(table, "name") is None or t.pick(table, "value") is None:
        return {}
    env: dict[str, str] = {}
    for (value,) in t.conn.execute(f"SELECT value FROM {table} WHERE name = 'DeviceEnvironment'"):
        for item in str(value).split(";"):
            key, sep, val = item.partition("=")
            if sep:
                env.setdefault(key, val)
    return env


def env_int(env: dict[str, str], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        if env.get(k, "").strip().isdigit():
            return int(env[k])
    return None


def ranks(procs: list[int], dev: dict[str, I64], host: dict[str, I64], strings: list[str],
          env: dict[str, str]) -> list[Rank]:
    """``(rank, processes, notes)`` per rank: ``procs`` (the processes with GPU work, or that launched it where
    the device records were lost) split or merged; ``dev`` and ``host`` the export's device and host rows."""
    pids = [p & 0xFFFFFF for p in procs]
    if len(procs) == 1:
        rank = env_int(env, RANK_ENV)
        said = [] if rank is not None else ["the export records no rank (RANK, SLURM_PROCID, ... in its "
                                            "environment, or an NVTX range 'rank N'): taken as rank 0"]
        return [(rank, procs, said)]
    nvtx_rank: dict[int, int] = {}
    for p in procs:
        mine = host["name"][(host["proc"] == p) & (host["kind"] == HostKind.ANNOTATION)]
        found = {int(m.group(1)) for i in distinct(mine) if (m := RANK_NVTX.search(strings[int(i)]))}
        if len(found) == 1:
            nvtx_rank[p] = found.pop()
    if len(nvtx_rank) == len(procs) and len(set(nvtx_rank.values())) == len(procs):
        return sorted(((nvtx_rank[p], [p], []) for p in procs), key=lambda r: r[0] or 0)
    coll = dev["kind"] == DeviceOpKind.COLLECTIVE
    devices = [set(dev["device"][dev["proc"] == p].tolist()) for p in procs]
    every_nccl = all(coll[dev["proc"] == p].any() for p in procs)
    disjoint = sum(len(d) for d in devices) == len(set().union(*devices))
    if every_nccl and disjoint:
        order = sorted(range(len(procs)), key=lambda i: (min(devices[i]), pids[i]))
        numbered = ["no rank recorded: each process runs NCCL kernels on its own GPUs, so ranks are numbered "
                    "by their lowest device"]
        return [(r, [procs[i]], numbered) for r, i in enumerate(order)]
    note = (f"{len(procs)} processes with GPU work (pids {', '.join(map(str, sorted(pids)))}) and no rank "
            "recorded for them: read as one rank")
    return [(env_int(env, RANK_ENV), procs, [note])]
