"""An XSpace decoded the plain way, into the reference's :class:`reference.RefTrace`.

Plain loops over the protobuf messages (the schema's generated module; the protobuf runtime
does the decoding) and the documented rules: device ``Stream #N`` lines are device work; on
the host, runtime calls (a ``correlation_id``, a driver/runtime name, a dispatch or a wait),
step markers (``step_num``), dropped Python-tracer frames, and operators; a line of runtime
calls only belongs to the thread whose events contain its calls. Nothing of gpuidle's reader
is used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import reference as ref

API = re.compile(r"^(cu|cuda|hip|hsa|nccl|rccl)[A-Z]")
DISPATCH = re.compile(r"^PjitFunction\(|ExecuteReplicated|LoadedExecutable::Execute$|^PJRT_LoadedExecutable_Execute$"
                      r"|^EagerExecute$|^EagerLocalExecute: |^TFE_Py_(Fast[A-Za-z]*)?Execute")


def _value(stat: Any, names: dict[int, str]) -> Any:
    which = stat.WhichOneof("value")
    v = getattr(stat, which) if which else None
    return names.get(v, "") if which == "ref_value" else v


def parse(path: Path) -> tuple[ref.RefTrace, list[tuple[str, int, int]]]:
    """The trace, and every host event before classification as ``(name, start, end)`` (for step tests)."""
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    t = ref.RefTrace()
    lines: list[tuple[str, list[dict[str, Any]]]] = []
    for plane in space.planes:
        snames = {k: v.name for k, v in plane.stat_metadata.items()}
        m = re.match(r"^/device:GPU:(\d+)", plane.name)
        for line in plane.lines:
            events = []
            for e in line.events:
                start = line.timestamp_ns + e.offset_ps // 1000
                end = line.timestamp_ns + (e.offset_ps + e.duration_ps) // 1000
                stats = {snames.get(s.metadata_id, ""): _value(s, snames) for s in e.stats}
                events.append({"name": plane.event_metadata[e.metadata_id].name, "start": start, "end": end,
                               "stats": stats})
            if m and line.name.startswith("Stream #"):
                for ev in events:
                    t.device_ops.append(ref.Ev(ev["start"], ev["end"], ev["name"], "kernel", ("dev", int(m.group(1))),
                                               int(m.group(1)), int(ev["stats"].get("correlation_id", -1)),
                                               htod="H2D" in ev["name"], index=len(t.device_ops)))
            elif plane.name == "/host:CPU":
                lines.append((line.display_name or line.name, events))
    owner = _owners(lines)
    flows: dict[tuple[Any, Any], str] = {}
    for name, events in lines:
        for ev in events:
            st = ev["stats"]
            if "_p" in st:
                flows[(st.get("_pt"), st["_p"])] = owner[name]
    everything = []
    for index, (name, events) in enumerate(lines):
        thread = owner[name]
        for i, ev in enumerate(events):
            st, n = ev["stats"], ev["name"]
            everything.append((n, ev["start"], ev["end"]))
            if "_c" in st and (src := flows.get((st.get("_ct"), st["_c"]))) and src != thread \
                    and not src.startswith("tf_data"):
                t.handoffs.add((("host", src), ("host", thread)))
            if ev["end"] <= ev["start"]:
                continue
            if "correlation_id" in st or API.match(n):
                cat = "cuda_runtime"
            elif ref.DATA.search(n):
                cat = "cpu_op"
            elif ref.SYNC.search(n) or DISPATCH.search(n):
                cat = "cuda_runtime"
            elif n.startswith("$"):
                continue
            else:
                cat = "cpu_op"
            if "step_num" in st:
                cat = "user_annotation"
            corr = int(st.get("correlation_id", -1)) if cat == "cuda_runtime" else -1
            t.host.append(ref.Ev(ev["start"], ev["end"], n, cat, ("host", thread), corr=corr,
                                 index=100_000_000 * (index + 1) + i))
    return t, everything


def _owners(lines: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, str]:
    """A line of runtime calls only belongs to the line whose events contain most of its calls."""
    out = {name: name for name, _ in lines}
    for name, events in lines:
        if not events or not all(API.match(e["name"]) for e in events):
            continue
        best, hits = name, 0
        for other, evs in lines:
            if other == name or all(API.match(e["name"]) for e in evs):
                continue
            inside = sum(any(o["start"] <= e["start"] and e["end"] <= o["end"] for o in evs) for e in events)
            if inside > hits:
                best, hits = other, inside
        if 2 * hits >= len(events):
            out[name] = best
    return out


def program_steps(everything: list[tuple[str, int, int]], program: str) -> list[tuple[int, int, int]]:
    """Steps as the outermost calls of ``PjitFunction(program)``: each to the next one's start."""
    calls = sorted((s, e) for n, s, e in everything if n == f"PjitFunction({program})")
    outer: list[tuple[int, int]] = []
    for s, e in calls:
        if not outer or s >= max(x[1] for x in outer):
            outer.append((s, e))
    return [(i, s, outer[i + 1][0] if i + 1 < len(outer) else e) for i, (s, e) in enumerate(outer)]
