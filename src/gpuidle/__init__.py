"""gpuidle: find out why your GPUs are idle, and what to change first."""

from __future__ import annotations

__version__ = "0.1.0"
