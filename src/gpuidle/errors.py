"""User-facing errors.

Every failure a user can cause (a missing file, a truncated gzip, a file that is
not a trace) is a :class:`GpuidleError`. The CLI prints its message as one line,
``gpuidle: error: <message>``, and exits with code 2. Anything else escaping is a bug.
"""

from __future__ import annotations


class GpuidleError(Exception):
    """Base class: ``str(err)`` is the whole one-line message, hint included."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} ({hint})" if hint else message)


class InputNotFound(GpuidleError):
    """A path given by the user does not exist or holds no usable file."""


class CorruptInput(GpuidleError):
    """The bytes cannot be read: truncated gzip, invalid JSON, cut-off file."""


class NotATrace(GpuidleError):
    """Readable JSON, but not a profiler trace gpuidle understands."""


class NoGpuActivity(GpuidleError):
    """A real trace without any GPU kernel, copy or set: nothing to analyse."""


class RemoteInputError(GpuidleError):
    """A URL cannot be read: unknown scheme, filesystem package missing, no credentials, access denied,
    server unreachable."""
