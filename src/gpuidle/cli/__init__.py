"""The command line: parse, call :mod:`gpuidle.api`, render, map errors to exit codes.

Each subcommand lives in its own module with a ``register(subparsers)`` function; this
module only assembles them. Exit codes: 0 done; 1 done, but the report is incomplete: it leaves out a
rank, file or job that could not be analysed (each named, with why), or gives a rank whose device records were
lost from its host side alone; 2 bad input or usage (one line on stderr, ``gpuidle: error: ...``); 130
interrupted. A subcommand may return another code (``gpuidle run`` returns its child's).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from gpuidle import __version__
from gpuidle.cli.common import Parser
from gpuidle.errors import GpuidleError
from gpuidle.report.text import printable

MODULES = ("analyze", "history", "probe", "live")
"""The modules under ``gpuidle.cli``, each with ``register(subparsers)``, in ``--help`` order."""

COMMANDS = {"analyze": "analyze", "history": "history", "compare": "history", "bench": "probe",
            "tune": "probe", "cost": "probe", "monitor": "live", "run": "live", "summarize": "live"}
"""Which module defines each subcommand: a run imports that module only (start-up is most of a small job)."""


def build_parser(command: str | None = None) -> Parser:
    """The parser for ``command`` alone, or for every subcommand (``--help``, a typo)."""
    parser = Parser(prog="gpuidle", description="Find out why your GPUs are idle, and what to change first. "
                    "Reads PyTorch profiler traces, JAX/TensorFlow XSpace profiles, Nsight Systems SQLite exports, "
                    "step-tracker folders (analyze) and nvidia-smi/DCGM logs (summarize).")
    parser.add_argument("--version", action="version", version=f"gpuidle {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    modules = [COMMANDS[command]] if command in COMMANDS else MODULES
    for name in modules:
        register: Callable[[argparse._SubParsersAction[Parser]], None] = importlib.import_module(
            f"gpuidle.cli.{name}").register
        register(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv``: its first word that is neither an option nor an option's value."""
    words = iter(argv)
    for word in words:
        if word == "--color":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


COLLECT_EVERY = 100_000
"""Allocations between two of the cyclic collector's young collections in the ``gpuidle`` process (Python's
default: 700). A command builds most of its objects once and keeps them to its end (modules, a trace's string
table, the report), so frequent collections only re-scan them; collections still come, every 100,000."""


KEEP_FREED = 1 << 30
"""Bytes of freed memory the ``gpuidle`` process keeps for reuse rather than hand back to the system, and the
size from which an allocation gets memory of its own (glibc's ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD``;
defaults 128 KiB, rising with use up to 32 MiB). Reading a big trace allocates and frees arrays of tens of MiB
over and over; handed back and asked for again, each page faults anew: a 1 GiB trace took 160,000-190,000 page
faults, 61,000-67,000 with the memory kept, and reads some 0.15 s sooner, at the same peak RSS."""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's options, from glibc's malloc.h


def run() -> int:
    """The ``gpuidle`` process (the command, ``python -m gpuidle``): :func:`main`, with the collector, the
    allocator and numpy's huge pages set for a short-lived process. At the end every object is frozen
    (``gc.freeze``): the interpreter's collections on the way out then pass over them, and a command ends
    15-20 ms sooner (numpy's objects alone cost 12 ms a collection); the objects are freed as before. Only here,
    never in :func:`main`, which a longer-lived caller may run, and never through the environment, which
    ``gpuidle run`` passes to training."""
    gc.set_threshold(COLLECT_EVERY, *gc.get_threshold()[1:])
    if _command(sys.argv[1:]) is not None:  # a subcommand's work; not ``--version``, ``--help`` or a usage error
        _keep_freed_memory()
        _numpy_without_huge_pages()
    code = main()
    gc.freeze()
    return code


def _numpy_without_huge_pages() -> None:
    """numpy's arrays of 4 MiB and more not marked for transparent huge pages (``madvise``), unless the user set
    ``NUMPY_MADVISE_HUGEPAGE``. Marked, each gets a huge page when first touched, and Linux compacts memory on the
    spot to find one where none is free: 0.2-0.5 s of system time for a 1 GiB trace on a machine whose memory is
    in use (2.54-3.02 s against 2.44-2.60 s without, five runs each). Set through numpy, not the environment,
    which ``gpuidle run`` passes to training; numpy loads here a little earlier than an analysis would load it."""
    if sys.platform != "linux" or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2, numpy 1
        try:
            switch = getattr(importlib.import_module(module), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if switch is not None:  # a numpy without the switch: as it is
            switch(False)
        return


def _keep_freed_memory() -> None:
    """glibc's allocator set to keep :data:`KEEP_FREED` bytes (elsewhere, or where it cannot be set: as it is)."""
    if sys.platform != "linux":
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    for option in (M_TRIM_THRESHOLD, M_MMAP_THRESHOLD):
        mallopt(option, KEEP_FREED)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    if command is None and "--version" in argv and not {"-h", "--help"} & set(argv):
        print(f"gpuidle {__version__}")  # as argparse would, without loading every subcommand to say it
        return 0
    try:
        args = build_parser(command).parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        code = func(args)
        sys.stdout.flush()  # here, where a full disk is an error line, not a complaint at the interpreter's exit
        return code
    except GpuidleError as err:
        print(f"gpuidle: error: {printable(str(err))}", file=sys.stderr)  # it may quote a file's name
        return 2
    except KeyboardInterrupt:
        print("gpuidle: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as err:  # the readers word their own: what is left is mostly the output (a full disk)
        where = f"{err.filename}: " if err.filename else ""
        print(f"gpuidle: error: {printable(where)}{err.strerror or err}", file=sys.stderr)
        return 2
