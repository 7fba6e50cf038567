"""Where ``gpuidle analyze`` spends its time on one trace: stage timings, then cProfile.

Stages, each timed without a profiler (best of ``--repeat``), every one from the file:

1. gunzip: inflate the file in 4 MiB blocks, nothing else;
2. stream: the reader's chunking (``TraceStream``) with a decoder that does nothing;
3. decode: the same with the reader's chunk reader (the compiled scanner where it is built, else the
   typed msgspec decoder);
4. read: ``kineto.read``: decode + columns (``Columns.add``) + numpy arrays (in this process: the
   split below times the serial read; ``GPUIDLE_READ_WORKERS`` sets the stages' reader);
5. analyse: ``summarize_rank`` on the timeline read once beforehand;
6. all: ``api.analyze`` + the JSON renderer, as ``gpuidle analyze --json`` does.

Then one whole analysis is split exactly, by timing wrappers put around the reader's
gunzip, chunk decoder, column builder, ``kineto.read``, ``summarize_rank`` and the JSON
renderer for the run (nothing is changed on disk): the shares printed. Last,
``--cprofile`` runs stage 6 under cProfile and prints the top functions by own and by
cumulative time (cProfile slows Python code more than C calls, so trust the split for
proportions and the profile for names).

    python bench/profile_analyze.py TRACE.json.gz [--repeat 3] [--cprofile]
    python bench/profile_analyze.py --size-mib 100 --cprofile    # scale the default source first
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import DEFAULT_SOURCE, MIB, OUT, machine
from scale_trace import copy_bytes, load, scale_trace


def _gunzip(path: str) -> int:
    """Inflate in 4 MiB input blocks and at most 8 MiB of output at a time."""
    n = 0
    with open(path, "rb") as f:
        z = zlib.decompressobj(wbits=47)  # gzip or zlib header
        while block := f.read(4 << 20):
            while block:
                n += len(z.decompress(block, 8 << 20))
                block = z.unconsumed_tail
    return n


def _stages(path: str) -> dict[str, Callable[[], Any]]:
    from gpuidle import api
    from gpuidle.analysis.summary import summarize_rank
    from gpuidle.report.jsonout import JsonRenderer
    from gpuidle.sources import kineto, kineto_read
    from gpuidle.sources.jsonstream import TraceStream

    decode = kineto_read.scan_or_decode
    timeline = kineto.read(path)

    def stream() -> int:
        return sum(1 for _ in TraceStream(path, len))

    def decoded() -> int:
        return sum(len(c) for c in TraceStream(path, decode))

    def everything() -> int:
        return len(JsonRenderer().render(api.analyze([path])))

    stages: dict[str, Callable[[], Any]] = {"gunzip": lambda: _gunzip(path), "stream": stream}
    stages["decode"] = decoded
    stages["read"] = lambda: kineto.read(path)
    stages["analyse"] = lambda: summarize_rank(timeline)
    stages["all"] = everything
    return stages


class _Split:
    """Times spent inside chosen functions during one full analysis (wrappers, not a profiler).

    Wraps: the reader's gunzip generator (``TraceStream._blocks``), its chunk reader
    (``kineto_read.scan_or_decode``), the column builder (``Columns.add``), ``kineto.read`` and
    ``summarize_rank`` (as each rank's analysis calls it), and the JSON renderer. A name that has
    moved stops the split with an error, where a stage wrapped in vain would read as taking no time.
    """

    def __init__(self) -> None:
        self.t: dict[str, float] = {}
        self._undo: list[tuple[Any, str, Any]] = []
        self._workers: str | None = None

    def _add(self, key: str, dt: float) -> None:
        self.t[key] = self.t.get(key, 0.0) + dt

    def _wrap(self, owner: Any, name: str, key: str) -> None:
        fn = getattr(owner, name)  # a name moved elsewhere fails here, not as a stage timed at zero

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self._add(key, time.perf_counter() - t0)

        self._undo.append((owner, name, fn))
        setattr(owner, name, timed)

    def _wrap_gen(self, owner: Any, name: str, key: str) -> None:
        fn = getattr(owner, name)  # a name moved elsewhere fails here, not as a stage timed at zero

        def timed(*a: Any, **k: Any) -> Any:
            it = fn(*a, **k)
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    self._add(key, time.perf_counter() - t0)
                    return
                self._add(key, time.perf_counter() - t0)
                yield item

        self._undo.append((owner, name, fn))
        setattr(owner, name, timed)

    def __enter__(self) -> _Split:
        from gpuidle.jobs import rank
        from gpuidle.report import jsonout
        from gpuidle.sources import jsonstream, kineto, kineto_columns, kineto_read

        self._wrap_gen(jsonstream.TraceStream, "_blocks", "gunzip")
        self._wrap(kineto_read, "scan_or_decode", "decode")
        self._wrap(kineto_columns.Columns, "add", "columns")
        self._wrap(kineto, "read", "read")
        self._wrap(rank, "summarize_rank", "analysis")
        self._workers = os.environ.get(kineto_read.WORKERS_ENV)
        os.environ[kineto_read.WORKERS_ENV] = "1"  # the wrappers time this process's work
        self._wrap(jsonout.JsonRenderer, "render", "render")
        return self

    def __exit__(self, *exc: object) -> None:
        from gpuidle.sources import kineto_read

        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)
        if self._workers is None:
            os.environ.pop(kineto_read.WORKERS_ENV, None)
        else:
            os.environ[kineto_read.WORKERS_ENV] = self._workers


def _split(path: str, repeat: int) -> tuple[float, dict[str, float]]:
    """The split of the fastest of ``repeat`` full runs: part -> seconds."""
    from gpuidle import api
    from gpuidle.report.jsonout import JsonRenderer

    best: tuple[float, dict[str, float]] | None = None
    for _ in range(repeat):
        with _Split() as sp:
            t0 = time.perf_counter()
            JsonRenderer().render(api.analyze([path]))
            total = time.perf_counter() - t0
        if best is None or total < best[0]:
            best = (total, dict(sp.t))
    assert best is not None
    total, t = best
    parts: dict[str, float] = {}
    read = t.get("read", 0.0)
    for key, label in (("gunzip", "gunzip (TraceStream._blocks)"),
                       ("decode", "chunk reading (scan_or_decode: the scanner, or msgspec)"),
                       ("columns", "columns (Columns.add)")):
        if key in t:
            parts[label] = t[key]
    parts["rest of read (chunk cutting, numpy arrays, steps)"] = read - sum(parts.values())
    parts["analysis (summarize_rank)"] = t.get("analysis", 0.0)
    parts["JSON render"] = t.get("render", 0.0)
    parts["the rest (advice, api, job view)"] = total - read - parts["analysis (summarize_rank)"] - parts["JSON render"]
    return total, parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", help="a trace file (default: scale --source to --size-mib)")
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    p.add_argument("--size-mib", type=float, default=100.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cprofile", action="store_true", help="also run the whole analysis under cProfile")
    p.add_argument("--top", type=int, default=25, help="functions to list from cProfile")
    args = p.parse_args(argv)
    made = None
    if args.trace is None:
        src = load(args.source)
        made = Path("/tmp/gpuidle-bench") / f"profile_{args.size_mib:g}MiB.json.gz"
        res = scale_trace(args.source, made, args.size_mib * MIB / copy_bytes(args.source, source=src), source=src)
        print(f"wrote {made}: {res.events:,} events, {res.bytes / MIB:.0f} MiB JSON")
        args.trace = str(made)
    import gpuidle

    print(f"gpuidle from {Path(gpuidle.__file__).parent}; load {machine()['load_avg']}")
    stages = _stages(args.trace)
    best: dict[str, float] = {}
    for i in range(args.repeat):
        for name, fn in stages.items():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            best[name] = min(best.get(name, dt), dt)
        print(f"  round {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in best.items()), flush=True)
    total, parts = _split(args.trace, args.repeat)
    print(f"\nsplit of one whole analysis (fastest of {args.repeat}), {total:.3f} s:")
    for k, v in parts.items():
        print(f"  {k:52s} {v:7.3f} s  {100 * v / total:5.1f} %")
    if args.cprofile:
        prof = cProfile.Profile()
        prof.runcall(stages["all"])
        for order in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(args.top)
            text = buf.getvalue()
            print(f"\n--- cProfile by {order} ---")
            print(text[text.find("   ncalls"):].rstrip())
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / f"profile_{order}.txt").write_text(text, encoding="utf-8")
    if made is not None:
        made.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
