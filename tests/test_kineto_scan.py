"""The compiled scanner against the typed decoder it stands in for.

Whatever a chunk holds, the scanner either gives exactly the columns that decoding it gives, or declines (None)
and leaves it to the decoder; it never accepts a chunk the decoder refuses. Checked on real traces (where it must
not decline: that is its speed), on hand-made chunks at the edges of JSON and of the event schema, and on
thousands of randomly damaged chunks.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import kscan_fuzz
from gpuidle.sources.jsonstream import TraceStream
from gpuidle.sources.kineto_events import decode_chunk
from gpuidle.sources.kineto_scan import SCANNER_BUILT, Scanned, scan
from kscan_fuzz import compare

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
REAL = [EXAMPLE, DATA / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        DATA / "mtia_inference_trace__mtia_inference_rank_0.json.gz", DATA / "h200_dataloader__before.pt.trace.json.gz",
        DATA / "rank_non_gpu__rank_non_gpu.json.gz", DATA / "fsdp2_cpu_gloo__rank0.pt.trace.json.gz",
        DATA / "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]

needs_scanner = pytest.mark.skipif(not SCANNER_BUILT, reason="the scanner is not built (no C compiler)")


def test_the_scanner_is_built_where_a_compiler_is() -> None:
    """An install with a C compiler has the scanner; without it, big traces read several times slower."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler})")
    assert SCANNER_BUILT


def chunks(path: Path) -> list[bytes]:
    """The chunks the reader hands its decoder (the stream finds the list's end where the decoder stops)."""

    def decoded(text: bytes) -> bytes:
        decode_chunk(text)
        return text

    return list(TraceStream(str(path), decoded))


@needs_scanner
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("__")[0])
def test_real_traces_read_the_same_and_none_declined(path: Path) -> None:
    texts = chunks(path)
    assert compare(texts) == 0
    assert sum(len(s) for s in map(scan, texts) if isinstance(s, Scanned)) > 0


def event(**fields: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.0,
            "args": {"device": 0, "stream": 7, "correlation": 3}} | fields


EDGES: dict[str, tuple[bytes, bool]] = {
    # name -> (chunk, whether the scanner reads it)
    "empty": (b"[]", True),
    "empty with spaces": (b" [ \n\t] \r\n", True),
    "escapes": (msgspec.json.encode([event(name="tab\t\"q\" \\ / é \u2603 \U0001f600 \x01")]), True),
    "escaped solidus and unicode escapes": (
        rb'[{"ph":"X","cat":"kernel","name":"a\/b\u00e9\ud83d\ude00","ts":1,"dur":1}]', True),
    "raw UTF-8 name": ('[{"ph":"X","cat":"kernel","name":"ü→😀","ts":1,"dur":1}]'.encode(), True),
    "string pid and tid": (msgspec.json.encode([event(pid="Spans", tid="stream 12 "), event(cat="cpu_op", pid="p",
                                                                                          tid="t")]), True),
    "stream in the tid": (msgspec.json.encode([event(tid="stream 9", args={"device": 1})]), True),
    "ROCm string stream": (msgspec.json.encode([event(args={"stream": "0x0", "device": 2}, tid=4)]), True),
    "null and missing args": (msgspec.json.encode([event(args=None), {"ph": "X", "cat": "cpu_op", "name": "op"}]),
                              True),
    "missing and bad times": (msgspec.json.encode([event(ts=-5.0), event(dur=8e15), {"ph": "X", "cat": "kernel"}]),
                              True),
    "device and stream past int32": (msgspec.json.encode([event(args={"device": 1 << 40}), event(args={"stream": -3})]),
                                     True),
    "other phases and categories": (
        msgspec.json.encode([event(ph="i"), event(cat="mtia_kernel"), event(cat="gpu_user_annotation")]), True),
    "nested unknown fields": (b'[{"ph":"X","cat":"cpu_op","name":"op","ts":1,"dur":2,"x":{"a":[1,{"b":null}],'
                              b'"c":[true,false,-0.5e-3]},"args":{"Input Dims":[[1,2],[]],"Input type":["float"],'
                              b'"y":{"z":[]}}}]', True),
    "collective": (msgspec.json.encode([event(cat="cpu_op", name="record_param_comms", args={
        "Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 1024, "Out msg nelems": 1024,
        "Group size": 8, "dtype": "BFloat16"}), event(cat="cpu_op", name="nccl:all_reduce", args={
            "Input Dims": [[256, 4]], "Input type": ["float"]})]), True),
    "numbers": (b'[{"ph":"X","cat":"kernel","name":"k","ts":1700000000123.456,"dur":1E2},'
                b'{"ph":"X","cat":"kernel","name":"k","ts":0.1e1,"dur":123456789012345678},'
                b'{"ph":"X","cat":"kernel","name":"k","ts":8000000000000000.0,"dur":0.25e-3}]', True),
    "digits past a double's": (b'[{"ph":"X","cat":"kernel","name":"k","ts":1700000000123.4567,'
                               b'"dur":0.30000000000000004}]', True),
    "more than 19 digits": (b'[{"ph":"X","cat":"kernel","name":"k","ts":17000000001234567890.1}]', False),
    "unbounded id": (msgspec.json.encode([event(pid=1 << 64)]), False),
    "float id": (b'[{"ph":"X","cat":"kernel","name":"k","pid":1.0}]', False),
    "string correlation": (msgspec.json.encode([event(args={"correlation": "3"})]), True),
    "ROCm string bytes": (msgspec.json.encode([event(cat="gpu_memcpy", args={"bytes": "616", "stream": "0x0",
                                                                             "device": "0"}), event()]), True),
    "string counts of a collective": (msgspec.json.encode([event(cat="cpu_op", name="record_param_comms", args={
        "Collective name": "allreduce", "In msg nelems": "1024", "Out msg nelems": "-0", "Group size": "08",
        "dtype": "Float"})]), True),
    "numeric strings the decoder coerces": (msgspec.json.encode([event(args={"bytes": " 6"}), event(args={
        "correlation": "0x1f"}), event(args={"device": "+1"}), event(args={"bytes": "1_0"})]), False),
    "numeric string past int64": (msgspec.json.encode([event(args={"bytes": "9223372036854775808"})]), False),
    "empty numeric string": (msgspec.json.encode([event(args={"correlation": ""})]), False),
    "null time": (b'[{"ph":"X","cat":"kernel","name":"k","ts":null}]', False),
    "duplicate field": (b'[{"ph":"X","cat":"kernel","name":"a","name":"b"}]', False),
    "not an object": (b'[{"ph":"X","cat":"kernel","name":"k"}, 5]', False),
    "non-ASCII collective": (msgspec.json.encode([event(cat="cpu_op", name="nccl:x", args={"dtype": "é"})]), False),
}


@needs_scanner
@pytest.mark.parametrize("name", list(EDGES))
def test_edges_of_json_and_the_schema(name: str) -> None:
    text, read = EDGES[name]
    assert (scan(text) is not None) == read
    compare([text])


@needs_scanner
def test_a_copy_size_written_as_a_string_reads_as_its_integer_whichever_path_reads_it() -> None:
    """ROCm writes a copy's size as a string: both paths read it as the integer, the string stream as none (the
    tid names it), and the other events of the chunk as if it were not there."""
    from gpuidle.sources.kineto_columns import Columns

    text = msgspec.json.encode([event(cat="gpu_memcpy", tid=4, args={"bytes": "616", "stream": "0x0", "device": "1"}),
                                event(args={"bytes": 8, "stream": "0x0"}, tid=9)])
    for chunk in (scan(text), decode_chunk(text)):
        assert chunk is not None
        cols = Columns()
        cols.add(chunk)
        assert np.concatenate(cols.dev["bytes"]).tolist() == [616, 8]
        assert np.concatenate(cols.dev["stream"]).tolist() == [4, 9]
        assert np.concatenate(cols.dev["device"]).tolist() == [1, 0]


EXACT = ["0", "-0", "1", "0.1", "-0.0", "1e-7", "123456.789e3", "9007199254740992", "1700000000000.001",
         "1e22", "8.589973e9", "0.0000000000000000001234", "4.5E+3", "2.50000", "9007199254740993.5",
         "0.30000000000000004", "1700000000000.0001", "1712140298123456.789", "1844674407370955.161",
         "1234567890123456789e-22", "9999999999999999999e3"]
"""Numbers the scanner reads itself: at most 19 significant digits, a power of ten within 22 (beyond 2^53 in
the digits, by exact 128-bit arithmetic)."""
DECLINED = ["0.000000000000000000001234", "1.7976931348623157e308", "4.9e-324", "1e23", "1e400",
            "12345678901234567890.5", "1.00000000000000000001", "18446744073709551615.0"]
"""Numbers it leaves to the decoder, whose rounding (or refusal) then stands."""


@needs_scanner
def test_times_are_the_decoders_doubles_to_the_bit() -> None:
    rng = random.Random(7)
    values = EXACT + [f"{rng.uniform(0, 2e12):.3f}" for _ in range(300)] + \
        [f"{rng.uniform(1.6e15, 1.8e15):.3f}" for _ in range(300)] + [repr(rng.uniform(0, 1e6)) for _ in range(300)] + \
        [f"{rng.uniform(0, 1e6):.{rng.randint(0, 9)}f}" for _ in range(300)] + \
        [f"{rng.randrange(1, 10**19)}e{rng.randint(-22, 3)}" for _ in range(300)] + \
        [f"{rng.uniform(0, 1e3):.{rng.randint(1, 17)}e}" for _ in range(300)]
    text = ("[" + ",".join(f'{{"ts":{v},"dur":{v}}}' for v in values) + "]").encode()
    scanned = scan(text)
    assert scanned is not None
    decoded = np.array([e.ts for e in decode_chunk(text)])
    assert scanned.ts.view(np.int64).tolist() == decoded.view(np.int64).tolist()
    for value in DECLINED:
        text = f'[{{"ts":{value}}}]'.encode()
        assert scan(text) is None, value
        compare([text]) if value != "1e400" else None


@needs_scanner
def test_damaged_chunks_are_read_the_same_or_declined() -> None:
    """Random cuts, insertions and byte changes in a real chunk: wherever the decoder refuses the result, the
    scanner declines; wherever both read it, the columns are the same."""
    with gzip.open(DATA / "h200_dataloader__before.pt.trace.json.gz") as f:
        events = msgspec.json.decode(f.read())["traceEvents"]
    base = msgspec.json.encode(events[:60])
    rng = random.Random(11)
    alphabet = b'{}[]:,"\\ -.0123456789eEtrufalsn\x00\xff\xc3uXkernl'
    read = refused = 0
    for _ in range(3000):
        text = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text))
            how = rng.randrange(3)
            if how == 0:
                del text[at:at + rng.randint(1, 4)]
            elif how == 1:
                text[at:at] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))
            else:
                text[at] = rng.choice(alphabet)
        chunk = bytes(text)
        try:
            decode_chunk(chunk)
        except (msgspec.DecodeError, RecursionError):
            assert scan(chunk) is None, chunk
            refused += 1
            continue
        compare([chunk])
        read += 1
    assert read > 100
    assert refused > 100


@needs_scanner
def test_a_short_fuzz_pass_finds_no_difference() -> None:
    """The grammar and mutation fuzzer (run for minutes under AddressSanitizer by .ci/sanitize), a fixed few
    thousand chunks here: every outcome is met many times."""
    counts = kscan_fuzz.run(0, seed=3, cases=3000)
    assert min(counts.values()) > 200, counts


@needs_scanner
def test_ids_survive_the_table_growing_with_freed_memory_poisoned() -> None:
    """A chunk of thousands of distinct names grows the string table several times; an id read from the slots
    after a grow freed them would be garbage here, where glibc fills freed memory and maps big blocks apart."""
    code = ("import kscan_fuzz as k; from gpuidle.sources.kineto_scan import scan\n"
            "for n in (511, 512, 513, 3000, 20000):\n"
            "    text = k.many_names(n); assert scan(text) is not None; assert k.compare([text]) == 0\n"
            "print('same')")
    env = os.environ | {"MALLOC_PERTURB_": "165", "MALLOC_MMAP_THRESHOLD_": "65536",
                        "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).parent),
                                                                     os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "same"


@needs_scanner
def test_the_string_hash_is_keyed_per_process() -> None:
    """Names cannot be built ahead to collide: the same bytes hash differently in another process."""
    code = "from gpuidle.sources import _kscan; print(_kscan.string_hash(b'ampere_sgemm_128x64_nn'))"
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(3)}
    assert len(seen) == 3


@needs_scanner
def test_names_built_to_collide_cost_what_the_decoder_costs() -> None:
    """The worst an attacker could do, knowing this process's key: 3,000 names whose hashes share their low 11
    bits, all in a few runs of the table (without the probe's bound: 5x the decoder's time, and growing with the
    square of the names). A look-up stops after a bounded probe and the decoder reads the chunk:
    its cost, side by side with an ordinary chunk of the same size, stays the decoder's, not quadratic."""
    from gpuidle.sources import _kscan
    from gpuidle.sources.kineto_scan import scan_or_decode

    crafted = kscan_fuzz.colliding_names(3000, 11, _kscan.string_hash)
    ordinary = msgspec.json.encode([{"ph": "X", "cat": "cpu_op", "name": f"o{i:08x}", "ts": 1, "dur": 1}
                                    for i in range(3000)])
    assert len(crafted) == len(ordinary)
    assert scan(crafted) is None
    assert scan(ordinary) is not None
    assert compare([crafted]) == 1

    def best(text: bytes, read: Any) -> float:
        times = []
        for _ in range(9):
            t0 = time.perf_counter()
            read(text)
            times.append(time.perf_counter() - t0)
        return min(times)

    ratio = best(crafted, scan_or_decode) / best(ordinary, decode_chunk)
    assert ratio < 3, f"crafted names {ratio:.1f}x the decoder's time on ordinary ones"


@needs_scanner
def test_a_bytes_subclass_is_never_read_in_place() -> None:
    kscan_fuzz.bytes_subclass_case()


def test_gpuidle_reader_python_reads_without_loading_the_scanner() -> None:
    """``GPUIDLE_READER=python`` (a broken build, a benchmark): the typed decoder reads every chunk, the compiled
    scanner never loaded, and the trace reads to the same columns."""
    code = ("import sys; from gpuidle.sources.kineto_read import read_columns; "
            "cols, _ = read_columns(sys.argv[1]); "
            "print('gpuidle.sources._kscan' in sys.modules, cols.events, len(cols.strings))")
    env = os.environ | {"GPUIDLE_READ_WORKERS": "1"}
    outs = [subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], env=env | {"GPUIDLE_READER": reader},
                           capture_output=True, text=True, check=True).stdout.split() for reader in ("python", "")]
    assert outs[0][0] == "False"
    assert outs[0][1:] == outs[1][1:]
    assert int(outs[0][1]) > 0


@needs_scanner
def test_the_string_hash_tells_apart_what_only_the_length_did() -> None:
    """The length has a fold of its own: strings whose first word XOR their length agree (``""``, ``"\\x01"``,
    ``"\\x02\\0"``, ...) once hashed alike (to 0) whatever the key; a name and the name padded with NULs too."""
    from gpuidle.sources import _kscan

    same_word_xor_length = [n.to_bytes(8, "little")[:n] for n in range(8)]
    padded = [b"name" + b"\0" * k for k in range(12)] + [b"\0" * k for k in range(1, 20)]
    short = [bytes([a, b]) for a in range(256) for b in range(256)] + [bytes([a]) for a in range(256)]
    for names in (same_word_xor_length, padded, short):
        hashes = [_kscan.string_hash(n) for n in names]
        assert len(set(hashes)) == len(names)
        assert 0 not in hashes


@needs_scanner
def test_an_allocation_that_fails_while_scanning_raises_memory_error() -> None:
    """Whichever allocation of the interpreter's fails (the strings' list, a string, a column), the scan raises
    MemoryError, never returns a value with an error set (SystemError)."""
    testcapi = pytest.importorskip("_testcapi")
    from gpuidle.sources import _kscan

    text = msgspec.json.encode([event(), event(name="other", cat="cpu_op", pid="p")])
    outcomes = set()
    for nth in range(60):
        testcapi.set_nomemory(nth, nth + 1)
        try:
            out = _kscan.scan(text)
        except MemoryError:
            out = "MemoryError"
        finally:
            testcapi.remove_mem_hooks()
        outcomes.add("MemoryError" if out == "MemoryError" else type(out).__name__)
    assert outcomes == {"MemoryError", "tuple"}
