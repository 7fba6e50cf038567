"""JSON in and out for every report type: ``report.to_json()`` and ``Report.from_json(text)``."""

from __future__ import annotations

from typing import Self

import msgspec


class JsonStruct(msgspec.Struct):
    """A struct that is its own JSON schema: encoded as-is, decoded and type-checked by msgspec."""

    def to_json(self, indent: int = 0) -> str:
        """The JSON text (``indent`` > 0 pretty-prints)."""
        text = msgspec.json.encode(self).decode()
        return msgspec.json.format(text, indent=indent) if indent else text

    @classmethod
    def from_json(cls, text: bytes | str) -> Self:
        """Read a report back; a document of another shape raises :class:`msgspec.ValidationError`."""
        return msgspec.json.decode(text, type=cls)
