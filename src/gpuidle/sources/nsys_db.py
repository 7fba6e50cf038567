"""Open an Nsight Systems SQLite export read-only, and read its tables by column name.

The file is opened through SQLite's URI ``file:…?mode=ro&immutable=1``: read-only, and
immutable, so SQLite takes no lock and writes no journal or WAL beside it. Columns differ
between Nsight versions (``greenContextId`` only in newer ones, ``globalPid`` only since
2021, ...), so every read names its columns, each with fallbacks, and never relies on
their position. A ``.nsys-rep`` report is first exported by ``nsys`` into a temporary
SQLite file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpuidle.errors import CorruptInput, GpuidleError, InputNotFound
from gpuidle.model import I64
from gpuidle.model.arrays import distinct

if TYPE_CHECKING:
    import sqlite3

# sqlite3 is imported where a file is opened: format detection (is_sqlite) must not load it.

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
"""Nsight Systems' own report files (``.qdrep`` before 2021.3)."""
CHUNK_ROWS = 1 << 16
REEXPORT = "export it again: nsys export --type sqlite --force-overwrite true REPORT.nsys-rep"


class MissingTool(GpuidleError):
    """A tool needed to read the input (``nsys``) is not installed."""


def is_sqlite(path: str | Path) -> bool:
    """Whether the file starts with SQLite's magic header."""
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def is_report(path: str | Path) -> bool:
    return str(path).endswith(REPORT_SUFFIXES)


def check_complete(path: str) -> None:
    """Refuse a cut-off file: the header's page count (when valid) times the page size must fit."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as err:
        raise InputNotFound(f"{path}: {err.strerror or err}") from None
    if len(head) < 100:
        raise CorruptInput(f"{path}: truncated SQLite file ({size} bytes, shorter than its 100-byte header)")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    header_valid = head[24:28] == head[92:96] and pages > 0
    if header_valid and size < page * pages:
        raise CorruptInput(f"{path}: truncated SQLite file ({size} of {page * pages} bytes)", REEXPORT)


def connect(path: str) -> sqlite3.Connection:
    """A read-only, immutable connection: the file is never written, not even a journal."""
    import sqlite3

    check_complete(path)
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as err:
        raise CorruptInput(f"{path}: not a readable SQLite file ({err})") from None
    return conn


@contextlib.contextmanager
def exported(path: str) -> Iterator[str]:
    """The SQLite export of ``path``: itself, or for a ``.nsys-rep`` a temporary export by ``nsys``."""
    if not is_report(path):
        yield path
        return
    if not os.path.exists(path):
        raise InputNotFound(f"{path}: no such file")
    import shutil  # only a report pays for these: detection runs on every input
    import subprocess
    import tempfile

    stem = Path(path).name.rsplit(".", 1)[0]
    nsys = shutil.which("nsys")
    if nsys is None:
        raise MissingTool(f"{path}: a Nsight Systems report needs nsys to be read, and nsys is not on PATH",
                          f"export it where nsys is installed: nsys export --type sqlite --output {stem}.sqlite "
                          f"{path}, then gpuidle analyze {stem}.sqlite")
    with tempfile.TemporaryDirectory(prefix="gpuidle-nsys-") as tmp:
        out = os.path.join(tmp, f"{stem}.sqlite")
        done = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                               "--output", out, path], capture_output=True, text=True, check=False)
        if done.returncode != 0 or not os.path.exists(out):
            last = (done.stderr or done.stdout).strip().splitlines()
            raise CorruptInput(f"{path}: nsys export failed ({last[-1] if last else f'exit {done.returncode}'})")
        yield out


def _quoted(name: str) -> str:
    """An SQL identifier from the file itself, quoted so that no name can end the statement."""
    return '"' + name.replace('"', '""') + '"'


def _not_integer(rows: list[tuple[object, ...]], table: str, columns: list[str]) -> str:
    """Where ``rows`` of ``table`` hold their first value that is not a 64-bit integer, and what it is."""
    for row in rows:
        for value, column in zip(row, columns, strict=True):
            number = type(value) in (int, float) and -(2.0**63) <= value < 2.0**63  # type: ignore[operator]
            if not number:
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                return f"{table}.{column} holds {shown}, not an integer"
    return f"{table}: a value that is not a 64-bit integer"


class Tables:
    """What an export holds: table names and each table's columns, read once.

    Tables only: Nsight writes no views, and a view is a query the file asks for, as slow as its author likes (a
    recursive one never ends); one named as a table the reader wants reads as that table missing."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        self.columns = {n: {r[1] for r in conn.execute(f"PRAGMA table_info({_quoted(n)})")} for n in names}

    def has(self, table: str) -> bool:
        return table in self.columns

    def pick(self, table: str, *candidates: str) -> str | None:
        """The first of ``candidates`` that ``table`` has."""
        cols = self.columns.get(table, set())
        return next((c for c in candidates if c in cols), None)

    def ints(self, table: str, wanted: dict[str, tuple[str, ...]], where: str = "") -> dict[str, I64] | None:
        """Integer columns of ``table`` by name: ``{out: (column, fallback, ...)}``; NULL and absent are -1.

        None when the table is absent or lacks a column of ``start``/``end`` if those are wanted.
        """
        if not self.has(table):
            return None
        exprs = []
        columns = []
        for key, candidates in wanted.items():
            col = self.pick(table, *candidates)
            if col is None and key in ("start", "end"):
                return None
            exprs.append(f'COALESCE("{col}", -1)' if col else "-1")
            columns.append(col or "")
        sql = f'SELECT {", ".join(exprs)} FROM "{table}"' + (f" WHERE {where}" if where else "")
        return self._fetch(sql, list(wanted), table, columns)

    def _fetch(self, sql: str, keys: list[str], table: str, columns: list[str]) -> dict[str, I64]:
        """The rows of ``sql`` as int64 columns named ``keys``; ``table``'s ``columns`` name a value that is not
        one.

        :raises CorruptInput: text, a blob, or an integer beyond 64 bits in an integer column.
        """
        cur = self.conn.execute(sql)
        parts = []
        while batch := cur.fetchmany(CHUNK_ROWS):
            try:
                parts.append(np.array(batch, dtype=np.int64).reshape(len(batch), len(keys)))
            except (TypeError, ValueError, OverflowError):
                raise CorruptInput(f"{self.path}: {_not_integer(batch, table, columns)}", REEXPORT) from None
        data = np.concatenate(parts) if parts else np.zeros((0, len(keys)), dtype=np.int64)
        return {k: np.ascontiguousarray(data[:, i]) for i, k in enumerate(keys)}

    def strings(self, ids: I64) -> dict[int, str]:
        """``StringIds`` values of the given ids."""
        wanted = distinct(ids[ids >= 0])
        out: dict[int, str] = {}
        if not self.has("StringIds") or wanted.size == 0:
            return out
        for lo in range(0, wanted.size, 900):  # under SQLite's limit on bound parameters
            part = wanted[lo:lo + 900].tolist()
            marks = ",".join("?" * len(part))
            out.update((int(i), str(v)) for i, v in
                       self.conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part))
        return out

    def string_ids(self, values: frozenset[str]) -> list[int]:
        """``StringIds`` ids of the given values (to filter rows in SQL rather than after fetching)."""
        if not self.has("StringIds") or not values:
            return []
        marks = ",".join("?" * len(values))
        return [int(r[0]) for r in self.conn.execute(f"SELECT id FROM StringIds WHERE value IN ({marks})",
                                                     sorted(values))]

    def meta(self, table: str) -> dict[str, str]:
        """A ``name``/``value`` table (``META_DATA_EXPORT``) as a dict; empty when absent."""
        if self.pick(table, "name") is None or self.pick(table, "value") is None:
            return {}
        return {str(n): str(v) for n, v in self.conn.execute(f'SELECT name, value FROM "{table}"')}
