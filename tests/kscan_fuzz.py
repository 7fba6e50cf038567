"""The compiled scanner fuzzed against the typed decoder it stands in for.

Every chunk, whatever its bytes, must give through the scanner either exactly the columns the decoder gives, or
None (the decoder then reads it); where the decoder refuses a chunk, the scanner must decline it. Chunks come from
a grammar of Kineto events (fields of every type, numbers at JSON's edges, escapes, nesting past the scanner's
depth, duplicated keys, thousands of distinct names) and from byte mutations of the bundled real traces.

Used by the tests (a short pass) and run as a script by ``.ci/sanitize`` against a build with AddressSanitizer and
UBSan, where any read past a buffer, use after free or undefined arithmetic ends the run::

    python tests/kscan_fuzz.py --seconds 120 [--extension path/to/_kscan.so] [--seed N] [--huge]

Each run draws a new seed and prints it first: a failing run is replayed with ``--seed``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

DATA = Path(__file__).parent / "data"
MUTATION_SEEDS = ["h200_dataloader__before.pt.trace.json.gz", "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                  "fsdp2_cpu_gloo__rank0.pt.trace.json.gz", "mtia_inference_trace__mtia_inference_rank_0.json.gz"]


def load_extension(path: str) -> None:
    """Put the scanner built at ``path`` in place of the installed one, before anything imports it."""
    import gpuidle.sources

    spec = importlib.util.spec_from_file_location("gpuidle.sources._kscan", path)
    assert spec is not None, path
    assert spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuidle.sources._kscan"] = module
    spec.loader.exec_module(module)
    gpuidle.sources._kscan = module  # type: ignore[attr-defined]


# --- the comparison -------------------------------------------------------------------------------------------


def state(cols: Any) -> dict[str, Any]:
    cols.done_adding()
    out: dict[str, Any] = {f"dev.{k}": np.concatenate(v) if v else None for k, v in cols.dev.items()}
    out |= {f"host.{k}": np.concatenate(v) if v else None for k, v in cols.host.items()}
    out |= {"coll": cols.coll, "strings": cols.strings, "threads": cols.threads, "skipped": cols.skipped,
            "foreign": cols.foreign, "events": cols.events, "hosts": cols.hosts}
    return out


def assert_same(scanned: dict[str, Any], decoded: dict[str, Any]) -> None:
    assert scanned.keys() == decoded.keys()
    for key, value in decoded.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == scanned[key].dtype, key
            assert np.array_equal(value, scanned[key], equal_nan=True), key
        else:
            assert scanned[key] == value, key


def _time(v: float) -> tuple[float, ...]:
    """A time to the bit: NaN (missing) as itself, and the sign of a zero kept."""
    return (math.nan,) if math.isnan(v) else (v, math.copysign(1.0, v))


def _args_key(a: Any) -> tuple[Any, ...] | None:
    """Every field of an args object; a string stream as none (-1), as the columns read it; Input Dims and Input
    type by their values (a coerced event's are encoded again)."""
    if a is None:
        return None

    def value(raw: Any) -> Any:
        try:
            return msgspec.json.decode(bytes(raw)) if bytes(raw) else []
        except msgspec.DecodeError:  # bytes a Raw field keeps unchecked (bad UTF-8): compared as they are
            return bytes(raw)

    return (a.correlation, a.device, a.stream if type(a.stream) is int else -1, a.bytes, a.collective, a.group,
            a.in_nelems, a.out_nelems, a.group_size, a.dtype, value(a.input_dims), value(a.input_type))


def scanned_rows(s: Any) -> list[tuple[Any, ...]]:
    """Every field of every event the scanner read, whatever its category or phase; the args read again from
    the text the scanner marked, as the columns read a collective's."""
    from gpuidle.sources.kineto_events import decode_args

    strings = s.strings
    rows = []
    for i in range(len(s)):
        pid = strings[s.pid_s[i]] if s.pid_s[i] >= 0 else int(s.pid[i])
        tid = strings[s.tid_s[i]] if s.tid_s[i] >= 0 else int(s.tid[i])
        lo, hi = int(s.args_lo[i]), int(s.args_hi[i])
        args = _args_key(decode_args(s.text[lo:hi])) if lo >= 0 else None
        rows.append((strings[s.cat[i]], strings[s.ph[i]], strings[s.name[i]], _time(float(s.ts[i])),
                     _time(float(s.dur[i])), pid, tid, int(s.corr[i]), int(s.device[i]), int(s.stream[i]),
                     int(s.nbytes[i]), args))
    return rows


def decoded_rows(events: list[Any]) -> list[tuple[Any, ...]]:
    """The same fields of every decoded event."""
    rows = []
    for e in events:
        a = e.args
        key = _args_key(a)
        ids = (-1, -1, -1, -1) if key is None else key[:4]
        rows.append((e.cat, e.ph, e.name, _time(e.ts), _time(e.dur), e.pid, e.tid, *ids, key))
    return rows


def compare(texts: list[bytes]) -> int:
    """Columns of the chunks scanned (declined ones decoded) against all decoded, and every field of every
    event of each chunk the scanner read; the chunks declined."""
    from gpuidle.sources.kineto_columns import Columns
    from gpuidle.sources.kineto_events import decode_chunk
    from gpuidle.sources.kineto_scan import scan

    by_scan, by_decoder, declined = Columns(), Columns(), 0
    for text in texts:
        decoded = decode_chunk(text)
        scanned = scan(text)
        declined += scanned is None
        if scanned is not None:
            rows, expected = scanned_rows(scanned), decoded_rows(decoded)
            assert len(rows) == len(expected), text[:200]
            for got, want in zip(rows, expected, strict=True):
                assert got == want, (got, want)
        by_scan.add(decoded if scanned is None else scanned)
        by_decoder.add(decoded)
    assert_same(state(by_scan), state(by_decoder))
    return declined


def check(text: bytes) -> str:
    """One chunk through both paths: 'read' (both, the same columns), 'declined' or 'refused' (by the decoder)."""
    from gpuidle.sources.kineto_events import decode_chunk
    from gpuidle.sources.kineto_scan import scan

    try:
        decode_chunk(text)
    except (msgspec.DecodeError, RecursionError):
        assert scan(text) is None, text[:200]
        return "refused"
    return "declined" if compare([text]) else "read"


# --- a grammar of Kineto events -------------------------------------------------------------------------------

NAMES = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s", "bp", "flow_in"]
ARG_NAMES = ["correlation", "device", "stream", "bytes", "Collective name", "Process Group Name", "dtype",
             "In msg nelems", "Out msg nelems", "Group size", "Input Dims", "Input type", "External id", "context"]
CATEGORIES = ["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "gpu_memset", "user_annotation", "python_function",
              "gpu_user_annotation", "cuda_driver", "ac2g", "Trace", "mtia_kernel"]
NUMBERS = ["0", "-0", "1", "-1", "7", "0.5", "1e3", "1E-7", "2.50000", "9007199254740993", "9223372036854775807",
           "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "18446744073709551616",
           "1700000000123.456", "1712140298123456.789", "0.30000000000000004", "1e22", "1e23",
           "4.9e-324", "1.7976931348623157e308", "12345678901234567890.5", "0." + "0" * 30 + "1",
           "1" + "0" * 40, "1" + "0" * 18 + ".0", "123456789012345678901234567890e-10"]
BAD_NUMBERS = ["1e400", "-1e400", "01", "-", "1.", ".5", "1e", "+1", "1e+", "0x10", "NaN", "Infinity", "--1",
               "1.2.3", "1ee2"]
STRING_BODIES = ["", "k", "aten::mm", "ampere_sgemm_128x64_nn", "é→😀", "tab\\there", "q\\\"uote", "\\u00e9",
                 "\\ud83d\\ude00", "a\\/b", "\\\\", "stream 7", "0x0", "allreduce", "BFloat16", "Spans"]
BAD_STRING_BODIES = ["\\ud83d", "\\udc00x", "\\x", "\\u12", "ctl\x01", "\xff"]


class Budget:
    """What one chunk may hold: distinct names made so far, and whether it may hold errors at all (most chunks
    are valid JSON, so that the scanner's reading, not only its declining, is compared)."""

    def __init__(self, rng: random.Random) -> None:
        self.distinct = 0
        self.errors = rng.random() < 0.3

    def error(self, rng: random.Random) -> bool:
        return self.errors and rng.random() < 0.05


def grammar_string(rng: random.Random, budget: Budget) -> str:
    roll = rng.random()
    if roll < 0.25:
        budget.distinct += 1
        return f'"n{budget.distinct}_{rng.randrange(1 << 30):x}"'
    if budget.error(rng):
        return '"' + rng.choice(BAD_STRING_BODIES) + '"'
    return '"' + rng.choice(STRING_BODIES) + '"'


def grammar_number(rng: random.Random, budget: Budget) -> str:
    if budget.error(rng):
        return rng.choice(BAD_NUMBERS)
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(NUMBERS)
    if roll < 0.6:
        return str(rng.randrange(-(1 << 70), 1 << 70) if rng.random() < 0.2 else rng.randrange(0, 1 << 40))
    if roll < 0.8:
        return f"{rng.uniform(0, 2e15):.{rng.randint(0, 6)}f}"
    return f"{rng.randrange(1, 10**rng.randint(1, 22))}e{rng.randint(-30, 30)}"


def grammar_value(rng: random.Random, budget: Budget, depth: int = 0) -> str:
    roll = rng.random()
    if roll < 0.3:
        return grammar_number(rng, budget)
    if roll < 0.6:
        return grammar_string(rng, budget)
    if roll < 0.7:
        return rng.choice(["nul", "tru", "fals"]) if budget.error(rng) else rng.choice(["null", "true", "false"])
    if roll < 0.8 and depth < 3:
        return "[" + ",".join(grammar_value(rng, budget, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    if roll < 0.9 and depth < 3:
        fields = (f'"{rng.choice(ARG_NAMES)}":{grammar_value(rng, budget, depth + 1)}'
                  for _ in range(rng.randint(0, 3)))
        return "{" + ",".join(fields) + "}"
    if roll < 0.92:
        deep = rng.randint(55, 75)  # around the scanner's depth limit (64)
        return "[" * deep + grammar_number(rng, budget) + "]" * deep
    return grammar_number(rng, budget)


def grammar_field(rng: random.Random, key: str, budget: Budget) -> str:
    """A field with, most of the time, the type the schema wants."""
    if rng.random() < 0.15:
        return grammar_value(rng, budget)
    if key == "cat":
        return f'"{rng.choice(CATEGORIES)}"'
    if key == "ph":
        return f'"{rng.choice("XiBEsfMC")}"'
    if key in ("ts", "dur"):
        return grammar_number(rng, budget)
    if key in ("pid", "tid"):
        return grammar_string(rng, budget) if rng.random() < 0.3 else str(rng.randrange(-2, 1 << 20))
    if key == "args":
        if rng.random() < 0.1:
            return "null"
        keys = rng.sample(ARG_NAMES, rng.randint(0, 6))
        if keys and rng.random() < 0.05:
            keys.append(keys[0])  # a duplicated key
        return "{" + ",".join(f'"{k}":{grammar_field(rng, k, budget)}' for k in keys) + "}"
    if key in ("correlation", "device", "stream", "bytes", "In msg nelems", "Out msg nelems", "Group size"):
        return grammar_number(rng, budget) if rng.random() < 0.9 else grammar_string(rng, budget)
    return grammar_string(rng, budget)


def spaces(rng: random.Random) -> str:
    return rng.choice(["", "", "", " ", "\n", " \t\r\n "])


def grammar_event(rng: random.Random, budget: Budget) -> str:
    keys = rng.sample(NAMES, rng.randint(0, len(NAMES)))
    if keys and rng.random() < 0.03:
        keys.append(rng.choice(keys))
    sp = spaces(rng)
    return "{" + sp + ("," + sp).join(f'"{k}"{sp}:{sp}{grammar_field(rng, k, budget)}' for k in keys) + sp + "}"


def grammar_chunk(rng: random.Random) -> bytes:
    budget = Budget(rng)
    n = rng.choice([0, 1, 3, 20, 60]) if rng.random() < 0.9 else rng.randint(300, 900)
    items = [grammar_event(rng, budget) if rng.random() < 0.98 else grammar_value(rng, budget)
             for _ in range(n)]
    text = spaces(rng) + "[" + spaces(rng) + ("," + spaces(rng)).join(items) + spaces(rng) + "]" + spaces(rng)
    if budget.error(rng):
        text = text[: rng.randrange(len(text) + 1)]  # cut anywhere
    return text.encode("utf-8", "surrogatepass")


# --- mutations of real chunks ---------------------------------------------------------------------------------

ALPHABET = b'{}[]:,"\\ -.0123456789eEtrufalsnu\x00\x01\x7f\x80\xbf\xc3\xe2\xed\xf0\xf4\xffXkernl'


def real_chunks() -> list[bytes]:
    """Slices of the bundled traces' event lists, a few dozen events each."""
    out = []
    for name in MUTATION_SEEDS:
        with gzip.open(DATA / name) as f:
            events = msgspec.json.decode(f.read())["traceEvents"]
        out += [msgspec.json.encode(events[i:i + 40]) for i in range(0, min(len(events), 2000), 40)]
    return out


def mutate(base: bytes, rng: random.Random) -> bytes:
    text = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(text) + 1)
        how = rng.randrange(5)
        if how == 0:
            del text[at:at + rng.randint(1, 8)]
        elif how == 1:
            text[at:at] = bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4)))
        elif how == 2 and at < len(text):
            text[at] = rng.choice(ALPHABET)
        elif how == 3:
            text[at:at] = text[max(0, at - 64):at]  # a run repeated
        else:
            del text[at:]
    return bytes(text)


# --- regression cases -----------------------------------------------------------------------------------------


def many_names(n: int) -> bytes:
    """A chunk with n distinct names, escaped ones among them (their copies are kept by the scanner)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op_{i}" + ("\t" if i % 3 == 0 else ""), "ts": i, "dur": 1}
              for i in range(n)]
    return msgspec.json.encode(events)


def colliding_names(n: int, bits: int, hash_of: Callable[[bytes], int]) -> bytes:
    """A chunk of n names whose hashes share their low ``bits`` bits (found by trying, with this process's key):
    they all fall into a few runs of the table."""
    found: list[bytes] = []
    start = 0
    while len(found) < n:
        tries = [b"c%08x" % i for i in range(start, start + (1 << 20))]
        hashes = np.fromiter(map(hash_of, tries), np.uint64, len(tries))
        found += [tries[i] for i in np.flatnonzero(hashes & np.uint64((1 << bits) - 1) == 0)]
        start += len(tries)
    return msgspec.json.encode([{"ph": "X", "cat": "cpu_op", "name": name.decode(), "ts": 1, "dur": 1}
                                for name in found[:n]])


def regressions() -> Iterator[tuple[str, bytes]]:
    yield "512+ distinct names (the table grows under a live slot)", many_names(3000)
    yield "escaped names past a grow", many_names(1500)


def bytes_subclass_case() -> None:
    """A bytes subclass is copied with its NUL, never read in place past its end."""
    from gpuidle.sources import _kscan

    class Sub(bytes):
        pass

    text = Sub(b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2')  # cut short: no closing bracket
    assert _kscan.scan(text) is None
    whole = Sub(b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2}]')
    out = _kscan.scan(whole)
    assert out is not None
    assert out[0] == 1


BLOCK = 1 << 21


def _repeated(head: bytes, zeros: int, tail: bytes) -> tuple[int, Callable[[], None]]:
    """The address of ``head``, ``zeros`` blocks of ``"0"`` and ``tail`` (each BLOCK bytes), then a NUL: one
    block of zeros mapped again and again into one stretch of addresses, so that gigabytes of digits take a few
    MiB of memory (Linux). Returns the address and what unmaps it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_none, prot_read, shared, private, fixed, anonymous, noreserve = 0, 1, 1, 2, 0x10, 0x20, 0x4000
    size = (zeros + 2) * BLOCK
    base = libc.mmap(None, size, prot_none, private | anonymous | noreserve, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    fds = []
    for i, text in enumerate((head.ljust(BLOCK, b"0"), b"0" * BLOCK, (tail + b"\0").ljust(BLOCK, b"\0"))):
        fd = os.memfd_create(f"kscan-digits-{i}")
        os.write(fd, text)
        fds.append(fd)
    for at in range(zeros + 2):
        fd = fds[0] if at == 0 else fds[2] if at == zeros + 1 else fds[1]
        got = libc.mmap(base + at * BLOCK, BLOCK, prot_read, shared | fixed, fd, 0)
        assert got == base + at * BLOCK, os.strerror(ctypes.get_errno())
    for fd in fds:
        os.close(fd)
    return base, lambda: libc.munmap(base, size)


def huge_digits_case(extension: str) -> None:
    """Numbers of 2^32 + 19 digits, past an int's count of them, read by the build at ``extension``: an integer
    must still read as past int64, and a fraction with 2^32 zeros before its digit as past a double's exponent
    (a counter of 32 bits wraps to 0 there and reads 1). Some 8 GiB of text, in a few MiB of memory."""
    import ctypes

    lib = ctypes.CDLL(extension)
    fallback = -1
    zeros = (1 << 32) // BLOCK - 1
    # "1", then 2^32 + 18 zeros: 1 + (BLOCK - 1) + zeros * BLOCK + 19 digits
    base, unmap = _repeated(b"1", zeros, b"0" * 19 + b"}")
    try:
        p, out = ctypes.c_void_p(base), ctypes.c_int64()
        assert lib.int_field(ctypes.byref(p), ctypes.byref(out)) == fallback, out.value
    finally:
        unmap()
    # "0.", then 2^32 - 1 zeros and a 1: 10^-(2^32)
    base, unmap = _repeated(b"0.", zeros, b"01}")
    try:
        p, is_int, ival, dval = ctypes.c_void_p(base), ctypes.c_int(), ctypes.c_int64(), ctypes.c_double()
        rc = lib.number(ctypes.byref(p), ctypes.byref(is_int), ctypes.byref(ival), ctypes.byref(dval))
        assert rc == fallback, dval.value
    finally:
        unmap()


# --- the run --------------------------------------------------------------------------------------------------


def run(seconds: float, seed: int, cases: int | None = None, progress: bool = False) -> dict[str, int]:
    """The regression cases, then grammar and mutation cases for about ``seconds`` (or exactly ``cases`` of
    them); the count of each outcome."""
    from gpuidle.sources import _kscan

    counts = {"read": 0, "declined": 0, "refused": 0}
    for _name, text in regressions():
        counts[check(text)] += 1
    counts[check(colliding_names(400, 12, _kscan.string_hash))] += 1
    bytes_subclass_case()
    rng = random.Random(seed)
    bases = real_chunks()
    deadline = time.monotonic() + seconds
    i, shown = 0, time.monotonic()
    while (i < cases) if cases is not None else (time.monotonic() < deadline):
        text = grammar_chunk(rng) if i % 2 == 0 else mutate(rng.choice(bases), rng)
        counts[check(text)] += 1
        i += 1
        if progress and time.monotonic() - shown > 30:
            print(f"  {i} chunks: {counts}", flush=True)
            shown = time.monotonic()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, help="replay a run (its seed is printed first); default: a new one")
    parser.add_argument("--extension", help="a build of _kscan to load in place of the installed one")
    parser.add_argument("--huge", action="store_true", help="also numbers of 2^32 digits (Linux; a few MiB)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"kscan fuzz: seed {seed} (replay with --seed {seed})", flush=True)
    if args.extension:
        load_extension(args.extension)
    counts = run(args.seconds, seed, progress=True)
    if args.huge:
        from gpuidle.sources import _kscan

        huge_digits_case(args.extension or _kscan.__file__)
    print(f"kscan fuzz: {sum(counts.values())} chunks, {counts['read']} read, {counts['declined']} declined, "
          f"{counts['refused']} refused by the decoder; no difference")


if __name__ == "__main__":
    main()
