"""Where JAX/TensorFlow profiles lie and how to tell one, without loading the XSpace reader: every
analysis asks this of its inputs, and only profiles pay for the reader's imports."""

from __future__ import annotations

import re
from pathlib import Path

PB_SUFFIX = ".xplane.pb"
_PLANE_NAME = re.compile(rb'"name"\s*:\s*"/(host|device):')


def is_xspace_json(head: bytes) -> bool:
    """Whether a Chrome trace's first bytes name XSpace planes (``/host:CPU``, ``/device:GPU:0``) as processes."""
    return _PLANE_NAME.search(head) is not None


def find_profiles(folder: Path) -> list[str]:
    """The hosts' ``*.xplane.pb`` of one run: directly in ``folder``, or in the newest run under
    ``plugins/profile/`` of a TensorBoard log dir (runs are named by their start time)."""
    here = sorted(str(f) for f in folder.glob(f"*{PB_SUFFIX}") if f.is_file())
    if here:
        return here
    runs = sorted(d for d in (folder / "plugins" / "profile").glob("*") if d.is_dir() and any(d.glob(f"*{PB_SUFFIX}")))
    return sorted(str(f) for f in runs[-1].glob(f"*{PB_SUFFIX}")) if runs else []
