"""``python -m gpuidle``: the same as the ``gpuidle`` command."""

from gpuidle.cli import run

raise SystemExit(run())
