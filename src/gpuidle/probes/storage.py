"""``bench storage PATH``: how fast a dataset folder reads, and whether the page cache flattered it.

Three timed phases share the budget, each on files the others did not touch (a file
read once sits in the page cache and would read fast the second time). The files are
split before any read (:func:`assign_files`):

- ``sequential``: files of 4 MiB or more (every other one, largest first), front to back
  in 4 MiB reads: MB/s of streaming;
- ``random``: the other files of 4 MiB or more, else half of those over twice ``block``:
  ``block``-sized reads at random offsets: MB/s and IOPS;
- ``files``: every remaining file, read whole (up to 8 MiB each) in random order: files/s,
  what a map-style Dataset of one sample per file needs.

A phase with no file of its kind is skipped with a note rather than run on files that
are too small for it; each phase reports the mean size of the reads it really made.

Before each read, ``mincore(2)`` says how much of it was already in the page cache
(outside the timing, as is the eviction); ``drop_cache`` first evicts the file with
``posix_fadvise(DONTNEED)`` (clean pages only; tmpfs keeps everything). Advice
follows from the numbers: sharded formats for many small files, a note when the
dataset fits in RAM.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from gpuidle.errors import GpuidleError, InputNotFound
from gpuidle.probes.common import KIB, MIB, human_bytes, ram_bytes

SCHEMA = "gpuidle.bench.storage/1"
SMALL_FILE = 512 * KIB
"""Median file size under this, with at least :data:`MANY_FILES` files: recommend shards."""
MANY_FILES = 1000
WHOLE_FILE_CAP = 8 * MIB
WALL_FACTOR = 3.0
"""A phase stops after this multiple of its budget in wall time, cache checks included."""
SEQ_CHUNK = 4 * MIB
RANDOM_FILES = 64
"""Files held open for the random reads."""
OPTIMISTIC = 0.5
"""Above this share of bytes from the page cache, a figure is called optimistic."""
LISTING_SHARE = 0.25
"""At most this share of the budget goes to listing the folder."""
PHASES = ("files", "sequential", "random")
RATE_MIN_COUNT = 10
"""Files (files/s) or reads (IOPS, MB/s) a phase must make for its rate to be given."""
RATE_MIN_BYTES = MIB
"""Bytes read that time MB/s well enough from fewer reads (one 4 MiB read of a large file)."""

Clock = Callable[[], float]
Progress = Callable[[str, int, int], None]


class Phase(msgspec.Struct):
    name: str
    seconds: float
    """Time spent reading (cache checks and evictions excluded)."""
    bytes: int
    files: int
    reads: int
    mb_per_s: float | None
    """Megabytes (10^6) per second."""
    files_per_s: float | None
    iops: float | None
    block_bytes: int | None
    """The read size asked for; None: whole files."""
    mean_read_bytes: int
    """Bytes / reads: the size of the reads really made (a file's tail is shorter than a block)."""
    cached_share: float | None
    """Share of the bytes read that were in the page cache beforehand; None: unknown on this OS."""


class Listing(msgspec.Struct):
    files: int
    complete: bool
    """False when listing stopped at ``max_files`` or its share of the budget."""
    total_bytes: int
    median_bytes: int
    mean_bytes: float
    largest_bytes: int


class StorageResult(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    path: str
    budget_s: float
    drop_cache: bool
    listing: Listing
    phases: list[Phase]
    ram_bytes: int | None
    cached_share: float | None
    """Over all phases."""
    advice: list[str] = []
    notes: list[str] = []


class _Mincore:
    """Page-cache residency through mincore(2) on a read-only mapping; None where unsupported."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.libc = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            self.libc = libc
        except (OSError, AttributeError):
            pass

    def share(self, fd: int, offset: int, length: int) -> float | None:
        """Share of the pages of ``[offset, offset + length)`` of the file now in the page cache."""
        if self.libc is None or length <= 0:
            return None
        import mmap

        lo = offset - offset % self.page
        size = offset + length - lo
        addr = self.libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, lo)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            vec = np.zeros(-(-size // self.page), dtype=np.uint8)
            if self.libc.mincore(ctypes.c_void_p(addr), size, vec.ctypes.data) != 0:
                return None
            return float((vec & 1).mean())
        finally:
            self.libc.munmap(ctypes.c_void_p(addr), size)


def list_files(root: Path, max_files: int, deadline: float, clock: Clock) -> tuple[list[tuple[str, int]], bool]:
    """``(path, size)`` of regular files under ``root``, sorted by path; stops at a limit."""
    out: list[tuple[str, int]] = []
    stack = [str(root)]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file():
                    out.append((e.path, e.stat().st_size))
            except OSError:
                continue
            if len(out) >= max_files or clock() > deadline:
                return sorted(out), False
    return sorted(out), True


def bench_storage(path: str | Path, *, budget_s: float = 20.0, block_bytes: int = 64 * KIB, drop_cache: bool = False,
                  max_files: int = 200_000, seed: int = 0, progress: Progress | None = None,
                  clock: Clock = time.perf_counter) -> StorageResult:
    """Read ``path`` for about ``budget_s`` seconds; a file or a folder, never written."""
    root = Path(path)
    if not root.exists():
        raise InputNotFound(f"{root}: no such file or folder")
    if budget_s <= 0 or block_bytes < 1:
        raise GpuidleError("--budget-s and --block must be positive")
    start = clock()
    if root.is_file():
        files, complete = [(str(root), root.stat().st_size)], True
    else:
        files, complete = list_files(root, max_files, start + LISTING_SHARE * budget_s, clock)
    files = [f for f in files if f[1] > 0]
    if not files:
        raise InputNotFound(f"{root}: no non-empty files to read", "point at the dataset folder")
    sizes = np.array([s for _, s in files], dtype=np.int64)
    listing = Listing(len(files), complete, int(sizes.sum()), int(np.median(sizes)), float(sizes.mean()),
                      int(sizes.max()))
    rng = random.Random(seed)
    mc = _Mincore()
    assigned = assign_files(files, block_bytes, rng)
    running = [name for name in PHASES if assigned[name]]
    phase_s = max(budget_s - (clock() - start), 0.3) / len(running)
    phases = []
    for i, name in enumerate(running):
        phase = _PHASE_FUNCS[name](assigned[name], rng, mc, phase_s, block_bytes, drop_cache, clock)
        if phase is not None:
            phases.append(phase)
        if progress is not None:
            progress(name, i + 1, len(running))
    total, _ = ram_bytes()
    cached = _weighted_cache(phases)
    advice, notes = storage_advice(listing, phases, cached, total, drop_cache, complete)
    notes = [skipped_note(name, listing, block_bytes) for name in PHASES if not assigned[name]] + notes
    return StorageResult(path=str(root), budget_s=budget_s, drop_cache=drop_cache, listing=listing, phases=phases,
                         ram_bytes=total, cached_share=cached, advice=advice, notes=notes)


def assign_files(files: list[tuple[str, int]], block: int,
                 rng: random.Random) -> dict[str, list[tuple[str, int]]]:
    """Each file to at most one phase, so that no phase reads what another brought into the page cache.

    Files of :data:`SEQ_CHUNK` or more, largest first, go alternately to ``random`` (up to
    :data:`RANDOM_FILES`, the files it holds open) and ``sequential`` (the first and every
    one left over). When no such file reaches ``random``, it takes every other file of
    more than ``2 × block`` (in random order, up to :data:`RANDOM_FILES`); ``files`` gets
    the rest. Pure but for ``rng``.
    """
    large = sorted((f for f in files if f[1] >= SEQ_CHUNK), key=lambda f: (-f[1], f[0]))
    randoms = large[1::2][:RANDOM_FILES]
    picked = {p for p, _ in randoms}
    sequential = [f for f in large if f[0] not in picked]
    rest = [f for f in files if f[1] < SEQ_CHUNK]
    whole: list[tuple[str, int]] = []
    eligible = 0
    for f in rng.sample(rest, len(rest)):
        if not large[1:] and f[1] > 2 * block and len(randoms) < RANDOM_FILES:
            eligible += 1
            if eligible % 2:
                randoms.append(f)
                continue
        whole.append(f)
    return {"sequential": sequential, "random": randoms, "files": whole}


def skipped_note(name: str, listing: Listing, block: int) -> str:
    """Why a phase has no figures: what file it would need, and the largest there is."""
    largest = human_bytes(listing.largest_bytes)
    if name == "sequential":
        return (f"sequential phase skipped: no file of {human_bytes(SEQ_CHUNK)} or more to stream (largest "
                f"{largest})")
    if name == "random":
        if listing.largest_bytes >= SEQ_CHUNK:
            return (f"random phase skipped: the sequential phase streams the one file of {human_bytes(SEQ_CHUNK)} "
                    f"or more, and no other file is over {human_bytes(2 * block)}")
        return (f"random phase skipped: no file of over {human_bytes(2 * block)} to read {human_bytes(block)} "
                f"blocks from at random offsets (largest {largest})")
    return "whole-file phase skipped: every file is read by the sequential or random phase"


class _Reader:
    """Times reads and keeps the cache evidence, with the checks themselves off the clock."""

    def __init__(self, name: str, mc: _Mincore, drop: bool, clock: Clock, budget: float,
                 block: int | None = None) -> None:
        self.name, self.mc, self.drop, self.clock, self.block = name, mc, drop, clock, block
        self.budget, self.wall_end = budget, clock() + WALL_FACTOR * budget
        self.seconds = 0.0
        self.bytes = self.files = self.reads = 0
        self.cached_bytes = 0.0
        self.known_bytes = 0

    @property
    def done(self) -> bool:
        return self.seconds >= self.budget or self.clock() > self.wall_end

    def open(self, path: str) -> int:
        """Open for the untimed work: evict (with ``drop``) and check residency."""
        fd = os.open(path, os.O_RDONLY)
        if self.drop and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return fd

    def check(self, fd: int, offset: int, n: int) -> float | None:
        return self.mc.share(fd, offset, n)

    def read(self, fd: int, offset: int, n: int, cached: float | None) -> int:
        t0 = self.clock()
        got = len(os.pread(fd, n, offset))
        self.seconds += self.clock() - t0
        self.add(got, cached)
        return got

    def add(self, got: int, cached: float | None) -> None:
        self.bytes += got
        self.reads += 1
        if cached is not None:
            self.cached_bytes += cached * got
            self.known_bytes += got

    def phase(self) -> Phase | None:
        """The phase's figures; a rate only from enough of what it counts (:data:`RATE_MIN_COUNT` files or reads,
        :data:`RATE_MIN_BYTES` for MB/s), else None: one 458-byte read is no files/s."""
        if self.reads == 0:
            return None
        s = self.seconds or 1e-9
        enough = self.reads >= RATE_MIN_COUNT
        return Phase(self.name, self.seconds, self.bytes, self.files, self.reads,
                     self.bytes / s / 1e6 if enough or self.bytes >= RATE_MIN_BYTES else None,
                     self.files / s if self.name == "files" and self.files >= RATE_MIN_COUNT else None,
                     self.reads / s if self.name == "random" and enough else None, self.block,
                     self.bytes // self.reads, self.cached_bytes / self.known_bytes if self.known_bytes else None)


def _phase_files(files: list[tuple[str, int]], rng: random.Random, mc: _Mincore, budget: float, block: int,
                 drop: bool, clock: Clock) -> Phase | None:
    """Open, read whole, close: the timing includes the open (its metadata is warm from the check)."""
    r = _Reader("files", mc, drop, clock, budget)
    for p, s in rng.sample(files, len(files)):
        if r.done:
            break
        n = min(s, WHOLE_FILE_CAP)
        fd = r.open(p)
        cached = r.check(fd, 0, n)
        os.close(fd)
        t0 = clock()
        fd = os.open(p, os.O_RDONLY)
        try:
            got = len(os.pread(fd, n, 0))
        finally:
            os.close(fd)
        r.seconds += clock() - t0
        r.add(got, cached)
        r.files += 1
    return r.phase()


def _phase_sequential(files: list[tuple[str, int]], rng: random.Random, mc: _Mincore, budget: float, block: int,
                      drop: bool, clock: Clock) -> Phase | None:
    r = _Reader("sequential", mc, drop, clock, budget, SEQ_CHUNK)
    for p, s in files:
        if r.done:
            break
        fd = r.open(p)
        cached = r.check(fd, 0, s)  # once: pages our own reads bring ahead are the kernel's readahead
        try:
            off = 0
            while off < s and not r.done:
                got = r.read(fd, off, SEQ_CHUNK, cached)
                if not got:
                    break
                off += got
            r.files += 1
        finally:
            os.close(fd)
    return r.phase()


def _phase_random(files: list[tuple[str, int]], rng: random.Random, mc: _Mincore, budget: float, block: int,
                  drop: bool, clock: Clock) -> Phase | None:
    """Reads at random offsets of files held open, as an indexed or memory-mapped dataset reads."""
    r = _Reader("random", mc, drop, clock, budget, block)
    pool = files[:RANDOM_FILES]
    fds = [(r.open(p), s) for p, s in pool]
    try:
        while not r.done:
            fd, s = fds[rng.randrange(len(fds))]
            off = rng.randrange(max(s - block, 0) + 1)
            off -= off % mc.page
            if drop and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, off, block, os.POSIX_FADV_DONTNEED)
            r.read(fd, off, block, r.check(fd, off, min(block, s - off)))
    finally:
        for fd, _ in fds:
            os.close(fd)
    r.files = len(pool)
    return r.phase()


_PHASE_FUNCS = {"files": _phase_files, "sequential": _phase_sequential, "random": _phase_random}


def _weighted_cache(phases: list[Phase]) -> float | None:
    known = [(p.cached_share, p.bytes) for p in phases if p.cached_share is not None]
    total = sum(b for _, b in known)
    return sum(c * b for c, b in known) / total if total else None


def storage_advice(listing: Listing, phases: list[Phase], cached: float | None, ram: int | None, drop: bool,
                   complete: bool) -> tuple[list[str], list[str]]:
    """What the figures mean: sharding, the page cache, the dataset against RAM. Pure."""
    advice: list[str] = []
    notes: list[str] = []
    by = {p.name: p for p in phases}
    if listing.files >= MANY_FILES and listing.median_bytes < SMALL_FILE:
        line = (f"{listing.files:,} files with a median of {human_bytes(listing.median_bytes)}: per-file opens and "
                "metadata dominate; pack the samples into shards of 100 MB-1 GB read sequentially "
                "(WebDataset tar shards, TFRecord, or MosaicML/LitData streaming formats)")
        f, s = by.get("files"), by.get("sequential")
        if f and s and f.mb_per_s and s.mb_per_s:
            whole = f"whole files (mean {human_bytes(f.mean_read_bytes)}) read at {f.mb_per_s:,.1f} MB/s"
            stream = f"{human_bytes(s.mean_read_bytes)} reads of large files at {s.mb_per_s:,.1f} MB/s"
            if f.mb_per_s < s.mb_per_s:
                line += f"; here {whole}, {stream} ({s.mb_per_s / f.mb_per_s:.1f}× faster)"
            else:
                line += (f"; here {whole}, no slower than {stream}: the per-file cost does not show on this "
                         "storage (page cache or a local SSD), it will on network or object storage")
        advice.append(line)
    warm = [p for p in phases if p.cached_share is not None and p.cached_share > OPTIMISTIC]
    if warm:
        which = ", ".join(f"{p.name} {p.cached_share:.0%}" for p in warm)
        if drop:
            notes.append(f"bytes still in the page cache after evicting them ({which}): tmpfs, dirty pages or a "
                         "filesystem that ignores fadvise; these figures are optimistic")
        else:
            notes.append(f"bytes served from the page cache ({which}): these figures are optimistic for data not "
                         "cached (a first epoch, or a dataset larger than RAM); --drop-cache evicts before reading")
    elif cached is None:
        notes.append("page-cache residency is unknown on this system (no mincore): figures may be optimistic")
    if ram and complete:
        if listing.total_bytes < 0.5 * ram:
            notes.append(f"the dataset ({human_bytes(listing.total_bytes)}) fits in RAM ({human_bytes(ram)}): "
                         "after the first epoch it is likely served from the page cache")
        else:
            notes.append(f"the dataset ({human_bytes(listing.total_bytes)}) does not fit in the page cache "
                         f"({human_bytes(ram)} RAM): every epoch reads from storage")
    if not complete:
        notes.append(f"listing stopped after {listing.files:,} files: sizes are those of the files listed")
    few = [p.name for p in phases if p.reads < RATE_MIN_COUNT]
    if few:
        notes.append(f"too few reads for a rate in {', '.join(few)} (under {RATE_MIN_COUNT}): '-' in the table; a "
                     "larger --budget-s or more files of that kind give one")
    return advice, notes
