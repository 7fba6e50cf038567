"""Pieces every subcommand shares: the parser class, argument types, output, warnings."""

from __future__ import annotations

import argparse
import sys

from gpuidle.errors import GpuidleError


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one ``gpuidle: error:`` line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise GpuidleError(message, f"see {self.prog} --help")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def warn(message: str) -> None:
    print(f"gpuidle: warning: {message}", file=sys.stderr)


def emit(text: str, out: str | None) -> None:
    """Write to stdout, or to the file ``out``."""
    if out is None:
        sys.stdout.write(text)
        return
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise GpuidleError(f"cannot write {out}: {err.strerror}") from None
