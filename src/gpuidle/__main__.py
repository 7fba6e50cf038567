"""``python -m gpuidle``: the same as the ``gpuidle`` command."""

from gpuidle.cli import main

raise SystemExit(main())
