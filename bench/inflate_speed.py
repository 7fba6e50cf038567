"""gzip inflate in the trace reader: the standard library's zlib (before) against ISA-L (``isal``, after).

A real trace is scaled to about ``--target-mib`` MiB of JSON (``scale_trace.py``). In each round, side by
side: GNU ``gzip -dc`` to /dev/null; inflating the file in 1 MiB blocks in this process with zlib and with
ISA-L; and the whole ``gpuidle analyze FILE --json --no-ledger`` in a fresh process with ISA-L blocked
(zlib: before) and with it (after). Best of ``--repeat`` rounds; results also go to
``bench/out/inflate_speed.json``.

    python bench/inflate_speed.py                       # 256 MiB
    python bench/inflate_speed.py --target-mib 1024 --repeat 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import DEFAULT_SOURCE, MIB, REPO, machine, write_json
from scale_trace import copy_bytes, load, scale_trace

ANALYZE = ("import sys\n"
           "if sys.argv[1] == 'zlib':\n"
           "    sys.modules['isal'] = None\n"
           "from gpuidle.cli import main\n"
           "from gpuidle.sources import inflate\n"
           "code = main(['analyze', sys.argv[2], '--json', '--no-ledger'])\n"
           "assert inflate.backend() == sys.argv[1], inflate.backend()\n"
           "sys.exit(code)\n")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to scale")
    p.add_argument("--target-mib", type=float, default=256, help="MiB of JSON of the scaled trace")
    p.add_argument("--repeat", type=int, default=3, help="rounds (best kept)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"), help="where the trace is written")
    return p.parse_args(argv)


def _trace(args: argparse.Namespace) -> Path:
    path = args.workdir / f"inflate_{args.target_mib:g}mib.json.gz"
    if not path.exists():
        args.workdir.mkdir(parents=True, exist_ok=True)
        source = load(args.source)
        scale = args.target_mib * MIB / copy_bytes(args.source, source=source)
        scale_trace(args.source, path, scale, source=source)
    return path


def _inflate(data: bytes, make: Callable[[], Any]) -> float:
    """As the reader does: 1 MiB of input at a time, at most 1 MiB out per call."""
    t0 = time.perf_counter()
    d = make()
    for at in range(0, len(data), MIB):
        pending = data[at:at + MIB]
        while pending:
            if d.eof:
                d = make()
            d.decompress(pending, MIB)
            pending = d.unconsumed_tail or d.unused_data
    return time.perf_counter() - t0


def _wall(cmd: list[str], **kwargs: Any) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO, **kwargs)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from isal import isal_zlib

    args = _args(argv)
    path = _trace(args)
    data = path.read_bytes()
    json_mib = len(zlib.decompress(data, wbits=31)) / MIB
    print(f"{path}: {len(data) / MIB:.1f} MiB gzip, {json_mib:.0f} MiB JSON", flush=True)
    rounds: list[dict[str, float]] = []
    for _ in range(args.repeat):
        rounds.append({
            "gzip_dc": _wall(["gzip", "-dc", str(path)]),
            "inflate_zlib": _inflate(data, lambda: zlib.decompressobj(wbits=31)),
            "inflate_isal": _inflate(data, lambda: isal_zlib.decompressobj(wbits=31)),
            "analyze_zlib": _wall([sys.executable, "-c", ANALYZE, "zlib", str(path)]),
            "analyze_isal": _wall([sys.executable, "-c", ANALYZE, "isal", str(path)]),
        })
    best = {k: min(r[k] for r in rounds) for k in rounds[0]}
    print(f"gzip -dc                 {best['gzip_dc']:7.2f} s")
    print(f"inflate  zlib (before)   {best['inflate_zlib']:7.2f} s   isal (after) {best['inflate_isal']:7.2f} s   "
          f"{best['inflate_zlib'] / best['inflate_isal']:.2f}x faster")
    print(f"analyze  zlib (before)   {best['analyze_zlib']:7.2f} s   isal (after) {best['analyze_isal']:7.2f} s   "
          f"{best['analyze_zlib'] / best['analyze_isal']:.2f}x faster; "
          f"against gzip -dc {best['analyze_zlib'] / best['gzip_dc']:.2f}x -> "
          f"{best['analyze_isal'] / best['gzip_dc']:.2f}x")
    out = write_json("inflate_speed.json", {"machine": machine(), "json_mib": json_mib, "rounds": rounds})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
