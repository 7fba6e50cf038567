class Column:
    """A column's raw values: int32 (cat, ph, name, pid_s, tid_s), float64 (ts, dur) or int64 (the rest)."""

    def __buffer__(self, flags: int, /) -> memoryview: ...

def scan(
    text: bytes, /
) -> tuple[int, list[str], Column, Column, Column, Column, Column, Column, Column, Column, Column, Column, Column,
           Column, Column, Column, Column] | None: ...
