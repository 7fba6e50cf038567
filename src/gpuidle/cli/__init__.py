"""The command line: parse, call :mod:`gpuidle.api`, render, map errors to exit codes.

Each subcommand lives in its own module with a ``register(subparsers)`` function; this
module only assembles them. Exit codes: 0 done; 2 bad input or usage (one line on
stderr, ``gpuidle: error: ...``); 130 interrupted. A subcommand may return another code
(``gpuidle run`` returns its child's).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gpuidle import __version__
from gpuidle.cli import analyze, history, live, probe
from gpuidle.cli.common import Parser
from gpuidle.errors import GpuidleError

COMMANDS: list[Callable[[argparse._SubParsersAction[Parser]], None]] = [
    analyze.register,
    history.register,
    probe.register,
    live.register,
]


def build_parser() -> Parser:
    parser = Parser(prog="gpuidle", description="Find out why your GPUs are idle, and what to change first.")
    parser.add_argument("--version", action="version", version=f"gpuidle {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except GpuidleError as err:
        print(f"gpuidle: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpuidle: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
