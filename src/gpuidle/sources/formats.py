"""Which reader a trace needs, told by its content: Kineto JSON, an XSpace profile (JAX, TensorFlow) or
an Nsight Systems export; and which files of a folder (or an object-store prefix) are traces.

A new format is one reader module beside this one and one branch in :func:`read_timelines`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuidle.errors import CorruptInput, GpuidleError, InputNotFound, NotATrace
from gpuidle.model import Timeline
from gpuidle.sources import inputs, kineto, nsys_db, xspace_files

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", *nsys_db.REPORT_SUFFIXES, xspace_files.PB_SUFFIX)


def find_trace_files(path: str | Path) -> list[str]:
    """One file, or the trace files (``*.json``, ``*.json.gz``, Nsight ``*.sqlite``/``*.nsys-rep``) directly
    inside a folder; for a JAX/TensorFlow run, its hosts' ``*.xplane.pb`` (in the folder, or the newest
    run of a log dir's ``plugins/profile/``; the trace JSON written beside them is the same profile).

    ``path`` may be an fsspec URL (``s3://bucket/job/traces/``): a prefix is listed like a folder. A
    local path that is neither a regular file nor a folder (a FIFO, a device), or that cannot be
    read, is a one-line error; inside a folder only regular files are taken.
    """
    what = "trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep, *.xplane.pb)"
    if not inputs.is_url(path):
        try:
            profiles = xspace_files.find_profiles(Path(path)) if Path(path).is_dir() else []
        except OSError:
            profiles = []  # listing it below says why it cannot be read
        if profiles and Path(profiles[0]).parent != Path(path):
            return profiles  # a log dir's newest run
        if profiles:  # beside them, xprof's JSON of each host is the same profile; any other trace is a rank too
            hosts = {Path(p).name[: -len(xspace_files.PB_SUFFIX)] for p in profiles}
            return [f for f in inputs.list_files(path, TRACE_SUFFIXES, what)
                    if f in profiles or _stem(f) not in hosts]
    return inputs.list_files(path, TRACE_SUFFIXES, what)


def _stem(path: str) -> str:
    """``host1.trace.json.gz`` -> ``host1``: the name xprof gives the JSON it writes beside ``host1.xplane.pb``."""
    name = Path(path).name
    for suffix in (".trace.json.gz", ".trace.json", ".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def input_size(path: str | Path) -> int:
    """Bytes in a local file or a remote object (0 when a server does not say)."""
    return inputs.size(path)


def is_nsys(path: str | Path) -> bool:
    """An Nsight Systems export (SQLite, told by its magic header) or report (``.nsys-rep``).

    SQLite reads a local file only: an export in object storage is refused with the command to fetch it.
    """
    if inputs.is_url(path):
        if str(path).endswith((*nsys_db.REPORT_SUFFIXES, ".sqlite")):
            raise InputNotFound(f"{inputs.display(str(path))}: an Nsight export is read from a local file",
                                "copy it first (e.g. aws s3 cp URL report.sqlite), then gpuidle analyze report.sqlite")
        return False
    return nsys_db.is_report(path) or nsys_db.is_sqlite(path)


def read_timelines(path: str, progress: Callable[[int, int], None] | None = None) -> list[Timeline]:
    """The timelines of one trace file, one per rank, its format told by its content.

    A Kineto trace or an XSpace profile (one host) is one rank; an Nsight Systems export can hold several.
    """
    if is_nsys(path):
        from gpuidle.sources import nsys

        return _few_devices(path, nsys.read(path))
    if is_xspace(path):
        from gpuidle.sources import xspace

        return _few_devices(path, [xspace.read(path, progress)])
    if str(path).endswith((".sqlite", *nsys_db.REPORT_SUFFIXES)):  # named as an export, yet not one
        raise NotATrace(f"{inputs.display(str(path))}: not an Nsight Systems export (no SQLite header)",
                        "export the report again: nsys export --type sqlite report.nsys-rep")
    return _few_devices(path, [kineto.read(path, progress)])


MAX_DEVICES = 256
"""The most devices one rank of a trace may hold: a process drives a host's GPUs (8 to 16 today). Each device's
idle is attributed over all of the rank's host events, so 20,000 device ids (a damaged or crafted id field) would
take minutes for nothing."""


def _few_devices(path: str, timelines: list[Timeline]) -> list[Timeline]:
    """``timelines``, refused where one holds more than :data:`MAX_DEVICES` devices."""
    for tl in timelines:
        if len(tl.devices) > MAX_DEVICES:
            raise CorruptInput(f"{inputs.display(str(path))}: {len(tl.devices)} devices in one rank, more than a "
                               f"host holds (the limit is {MAX_DEVICES})",
                               "a damaged device id field, or not a profiler trace")
    return timelines


def is_xspace(path: str | Path) -> bool:
    """An XSpace profile (JAX, TensorFlow): ``*.pb``, a protobuf whose first field is a plane named like
    one, or the Chrome JSON xprof writes from one (its first processes are XSpace planes, ``/host:CPU``).

    A remote ``.pb`` is refused with the command to fetch it; remote JSON is read as Kineto's.
    """
    import gzip
    import zlib

    if inputs.is_url(path):
        if str(path).endswith(".pb"):
            raise InputNotFound(f"{inputs.display(str(path))}: an XSpace profile is read from a local file",
                                "copy it first (e.g. gcloud storage cp URL .), then gpuidle analyze the copy")
        return False
    if str(path).endswith(".pb"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
            if head[:2] == b"\x1f\x8b":
                f.seek(0)
                head = gzip.GzipFile(fileobj=f).read(1 << 16)
    except (OSError, EOFError, zlib.error):
        return False  # the Kineto reader says what is wrong with it
    if head.lstrip()[:1] in (b"{", b"["):
        return xspace_files.is_xspace_json(head)
    # XSpace.planes is field 1 (length-delimited, tag 0x0a), and the first plane is named early
    return head[:1] == b"\n" and (b"/host:" in head or b"/device:" in head)


def looks_like_trace(path: str) -> bool:
    """Whether the file starts like a profiler trace (plain or gzip JSON with ``traceEvents``)."""
    import zlib

    try:
        with inputs.open_input(path) as f:
            start = f.read(1 << 16)
        if start[:2] == b"\x1f\x8b":
            start = zlib.decompressobj(wbits=31).decompress(start, 1 << 16)
    except (zlib.error, GpuidleError):
        return False
    return b'"traceEvents"' in start or b'"ph"' in start
