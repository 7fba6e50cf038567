"""Running gpuidle bound by file permissions, as root or as a user.

As root the child drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH with ``setpriv`` (util-linux), so a
mode-000 file or folder refuses it as it refuses a user; the interpreter and sources stay readable.
"""

from __future__ import annotations

import os
import shutil

import pytest

DROP = "-dac_override,-dac_read_search"


def unprivileged() -> list[str]:
    """The prefix that runs a command bound by file permissions, root or not."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): file permissions cannot be tested")
    return [setpriv, f"--inh-caps={DROP}", f"--bounding-set={DROP}"]
