"""The ledger: every run gpuidle measures, kept in one SQLite file, so "did it help?" has an answer.

The guide's last step is "after each change, re-measure; keep a log of changes and their
impact". The ledger is that log. Each record holds the report JSON as written, a label
and notes, when and where it ran (host, GPU model and count, the git commit of the
working directory and whether it had uncommitted changes), and the inputs it read with
their size and SHA-256 (a URL: its size and ETag), so a later comparison knows exactly what was measured.

Where: ``--ledger PATH``, else ``$GPUIDLE_LEDGER``, else
``$XDG_DATA_HOME/gpuidle/ledger.sqlite`` (``~/.local/share/gpuidle/ledger.sqlite``).

Safety: the file is opened in WAL mode and every write is one ``BEGIN IMMEDIATE``
transaction, so several processes (one per node of a job) can record at once without
corrupting it; SQLite's busy timeout makes them queue. The schema is versioned
(``PRAGMA user_version``) and upgraded in place by :data:`MIGRATIONS`, inside a
transaction. The file is marked as ours with ``PRAGMA application_id``: a database
of another program (tables of its own, or its own application id even before it has
tables), a file that is not SQLite, a damaged ledger (SQLite's ``quick_check`` fails
inside the write transaction, before anything is written) or a ledger written by a
newer gpuidle is refused with a :class:`LedgerError`, never modified. Readers
(:meth:`Ledger.for_reading`) open the file read-only when gpuidle may not write it or
its folder, so ``history`` reads a WAL ledger in a read-only folder too.

Other commands record through :func:`record`::

    from gpuidle import ledger
    run_id = ledger.record("bench", result_json, label="nccl after upgrade", inputs=[])
"""

from __future__ import annotations

import hashlib
import os
import platform
import sqlite3
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import quote

import msgspec

from gpuidle import notebook
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport

ENV = "GPUIDLE_LEDGER"  # cli.common.LEDGER_ENV names it in help without importing this module
APPLICATION_ID = 0x67707569
"""``PRAGMA application_id`` of a gpuidle ledger: ASCII ``gpui``."""
BUSY_TIMEOUT_S = 30.0
"""How long a writer waits for another process's transaction before giving up."""
KINDS = ("analyze", "run", "monitor", "summarize", "tracker", "bench")
"""What records are: the command that produced the report. Only :data:`ANALYSIS_KINDS` can be compared."""
ANALYSIS_KINDS = ("analyze", "tracker")
"""Kinds whose report is an :class:`~gpuidle.model.AnalysisReport` (``gpuidle.analysis/1``).

``run``, ``monitor`` and ``summarize`` record a utilization report, ``bench`` a probe's result."""

MIGRATIONS: list[list[str]] = [
    # 1: runs with their report, and the inputs they read
    [
        f"PRAGMA application_id = {APPLICATION_ID}",
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            created TEXT NOT NULL,
            label TEXT,
            notes TEXT,
            host TEXT,
            report TEXT NOT NULL
        )""",
        """CREATE TABLE inputs (
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            path TEXT NOT NULL,
            size INTEGER,
            sha256 TEXT
        )""",
        "CREATE INDEX inputs_run ON inputs(run_id)",
    ],
    # 2: what makes two runs comparable (GPU, world size, batch), the code version, headline figures
    [
        "ALTER TABLE runs ADD COLUMN gpu_model TEXT",
        "ALTER TABLE runs ADD COLUMN gpu_count INTEGER",
        "ALTER TABLE runs ADD COLUMN batch_size INTEGER",
        "ALTER TABLE runs ADD COLUMN git_commit TEXT",
        "ALTER TABLE runs ADD COLUMN git_dirty INTEGER",
        "ALTER TABLE runs ADD COLUMN utilization REAL",
        "ALTER TABLE runs ADD COLUMN step_s REAL",
        "CREATE INDEX runs_label ON runs(label)",
    ],
    # 3: remote inputs (URLs) are identified by their ETag or the store's content hash, not a SHA-256
    [
        "ALTER TABLE inputs ADD COLUMN etag TEXT",
    ],
]
"""``MIGRATIONS[i]`` upgrades schema version ``i`` to ``i + 1``. Append only; never edit a shipped one."""
SCHEMA_VERSION = len(MIGRATIONS)


class LedgerError(GpuidleError):
    """The ledger cannot be opened, read or written."""


class Facts(TypedDict, total=False):
    """What :func:`record` stores beside the report: notes, and the figures history shows and compare checks."""

    notes: str | None
    gpu_model: str | None
    gpu_count: int | None
    batch_size: int | None
    utilization: float | None
    """0..1."""
    step_s: float | None


def analysis_facts(report: AnalysisReport) -> Facts:
    """What the ledger keeps beside an analysis: GPU model, the GPUs with work, utilization and the steady step,
    each as ``analyze`` shows it (:mod:`gpuidle.analysis.figures`)."""
    from gpuidle.analysis import compare as comparison

    summary = comparison.summarize(report)
    return Facts(gpu_model=summary.gpu_model, gpu_count=summary.gpus, utilization=summary.utilization,
                 step_s=summary.step_s)


@dataclass(frozen=True, slots=True)
class InputFile:
    path: str
    size: int | None
    sha256: str | None
    """None when the file could not be read when the run was recorded, and for URLs."""
    etag: str | None = None
    """A URL's ETag (or its store's content hash), from its metadata; None for local files."""


@dataclass(frozen=True, slots=True)
class Run:
    """One recorded run. ``report`` is the JSON exactly as recorded."""

    id: int
    kind: str
    created: str
    """ISO 8601, UTC."""
    label: str | None
    notes: str | None
    host: str | None
    gpu_model: str | None
    gpu_count: int | None
    batch_size: int | None
    git_commit: str | None
    git_dirty: bool | None
    utilization: float | None
    step_s: float | None
    inputs: list[InputFile]
    report: str

    def analysis(self) -> notebook.AnalysisReport:
        """The recorded report as an :class:`AnalysisReport`, for the :data:`ANALYSIS_KINDS` records."""
        if self.kind not in ANALYSIS_KINDS:
            raise LedgerError(f"run {self.id} is a {self.kind} record, not an analysis report",
                              "compare runs recorded by gpuidle analyze")
        try:
            return msgspec.json.decode(self.report, type=notebook.AnalysisReport)
        except msgspec.DecodeError as err:
            raise LedgerError(f"run {self.id}: the recorded report cannot be read ({err})") from None

    @property
    def name(self) -> str:
        """How to refer to the run in a sentence."""
        return f"run {self.id}" + (f" ({self.label})" if self.label else "")


def default_path() -> Path:
    """``$GPUIDLE_LEDGER``, else the user's data directory (XDG)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "gpuidle" / "ledger.sqlite"


_COLUMNS = ("id, kind, created, label, notes, host, gpu_model, gpu_count, batch_size, git_commit, git_dirty, "
            "utilization, step_s, report")


def exists(path: str | Path) -> bool:
    """Whether there is a ledger file at ``path``; a folder on the way gpuidle may not search is a LedgerError."""
    try:
        return Path(path).expanduser().exists()
    except OSError as err:
        raise LedgerError(f"{path}: cannot open the ledger ({err.strerror})") from None


class Ledger:
    """An open ledger. Use as a context manager, or call :meth:`close`.

    ``read_only``: open the file without ever writing it (no migration: a ledger of an older
    schema must be upgraded by a writer first).
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.read_only = read_only
        try:
            if self.path.is_dir():
                raise LedgerError(f"{self.path}: is a folder, not a ledger file", "give a file path to --ledger")
            if not read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._connect("mode=ro" if read_only else None)
        except OSError as err:
            raise LedgerError(f"{self.path}: cannot open the ledger ({err.strerror})") from None
        except sqlite3.Error as err:
            raise LedgerError(f"{self.path}: cannot open the ledger ({err})") from None
        try:
            self._prepare()
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def for_reading(cls, path: str | Path) -> Ledger:
        """Open to read: as a writer when gpuidle may write the file and its folder (so an older schema is
        upgraded); else read-only."""
        p = Path(path).expanduser()
        writable = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)
        return cls(p, read_only=not writable)

    def _connect(self, uri_options: str | None) -> sqlite3.Connection:
        if uri_options is None:
            return sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        uri = f"file:{quote(str(self.path.absolute()))}?{uri_options}"
        return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    # -- opening: identity, version, migrations -------------------------------------
    def _prepare(self) -> None:
        with self._errors("open"):
            if self.read_only:
                self._prepare_read_only()
                return
            app_id, version, tables = self._identity()
            self._check(app_id, version, tables)
            if version < SCHEMA_VERSION:
                self._migrate()
            self._db.execute("PRAGMA foreign_keys = ON")
            with suppress(sqlite3.OperationalError):  # another process is switching it now; WAL once set
                self._db.execute("PRAGMA journal_mode = WAL")

    def _prepare_read_only(self) -> None:
        try:
            app_id, version, tables = self._identity()
        except sqlite3.OperationalError:
            # a WAL ledger in a folder gpuidle may not write: SQLite cannot make its -shm file there,
            # so read the file as it stands (no writer can be adding to it from here either)
            self._db.close()
            self._db = self._connect("immutable=1")
            app_id, version, tables = self._identity()
        self._check(app_id, version, tables)
        if version < SCHEMA_VERSION:
            raise LedgerError(f"{self.path}: a ledger of schema {version} needs an upgrade to {SCHEMA_VERSION}, "
                              f"and gpuidle may not write the file or its folder",
                              "record one run with write access to upgrade it")

    def _identity(self) -> tuple[int, int, int]:
        """Application id, schema version and table count, read in one transaction: read one by one, another
        process creating the ledger between two reads made a new ledger look like a foreign database."""
        db = self._db
        own = not db.in_transaction
        if own:
            db.execute("BEGIN")
        try:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            if own:
                db.execute("COMMIT")
        return int(app_id), int(version), int(tables)

    def _check(self, app_id: int, version: int, tables: int) -> None:
        if app_id != APPLICATION_ID and (app_id or tables or version):
            raise LedgerError(f"{self.path}: this SQLite database is not a gpuidle ledger",
                              "give another --ledger path; the file was left untouched")
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"{self.path}: written by a newer gpuidle (ledger schema {version}; this version reads up to "
                f"{SCHEMA_VERSION})", "upgrade gpuidle, or use another --ledger path")

    def _migrate(self) -> None:
        """Upgrade in one transaction; re-check inside it, as another process may have just done it."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            app_id, version, tables = self._identity()
            self._check(app_id, version, tables)
            self._check_intact()
            for step in MIGRATIONS[version:]:
                for statement in step:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as err:
            text = str(err)
            if "not a database" in text or "malformed" in text or "encrypted" in text:
                raise LedgerError(f"{self.path}: not a gpuidle ledger, or a damaged one ({text})",
                                  "give another --ledger path; the file was left untouched") from None
            raise LedgerError(f"{self.path}: cannot {doing} the ledger ({text})") from None

    def _check_intact(self) -> None:
        """Refuse to write to a damaged file: a write could spread the damage over the runs still readable.

        ``quick_check`` (the b-tree structure, without matching indexes to tables) reads every page
        once; run inside the write transaction, it checks exactly the file the write lands on.
        """
        problems = [str(row[0]) for row in self._db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            first = problems[0].replace("*** in database main ***", "").strip().splitlines()[0]
            raise LedgerError(f"{self.path}: the ledger is damaged ({first})",
                              "give another --ledger path; the file was left untouched, and "
                              "`sqlite3 FILE .recover` saves the runs still readable")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._errors("write"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._check_intact()
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- writing -------------------------------------------------------------------
    def record(
        self,
        kind: str,
        report_json: bytes | str,
        *,
        label: str | None = None,
        notes: str | None = None,
        inputs: Sequence[str | Path | InputFile] = (),
        gpu_model: str | None = None,
        gpu_count: int | None = None,
        batch_size: int | None = None,
        utilization: float | None = None,
        step_s: float | None = None,
        workdir: str | Path | None = None,
    ) -> int:
        """Store one run and return its id. See :func:`record`."""
        report = report_json.decode() if isinstance(report_json, bytes) else report_json
        files = [p if isinstance(p, InputFile) else describe_input(p) for p in inputs]
        commit, dirty = git_state(workdir)
        created = datetime.now(UTC).isoformat(timespec="milliseconds")
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO runs (kind, created, label, notes, host, report, gpu_model, gpu_count, batch_size, "
                "git_commit, git_dirty, utilization, step_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (kind, created, label, notes, platform.node(), report, gpu_model, gpu_count, batch_size,
                 commit, None if dirty is None else int(dirty), utilization, step_s),
            )
            run_id = int(cur.lastrowid or 0)
            db.executemany("INSERT INTO inputs (run_id, path, size, sha256, etag) VALUES (?, ?, ?, ?, ?)",
                           [(run_id, f.path, f.size, f.sha256, f.etag) for f in files])
        return run_id

    # -- reading -------------------------------------------------------------------
    def runs(self, limit: int | None = None, kind: str | None = None) -> list[Run]:
        """Recorded runs, newest first."""
        where, params = ("WHERE kind = ?", [kind]) if kind else ("", [])
        sql = f"SELECT {_COLUMNS} FROM runs {where} ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._errors("read"):
            rows = self._db.execute(sql, params).fetchall()
            return [self._run(row) for row in rows]

    def get(self, run_id: int) -> Run | None:
        if not 0 <= run_id < 1 << 63:  # past SQLite's integers: no such run (not an OverflowError)
            return None
        with self._errors("read"):
            row = self._db.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            return None if row is None else self._run(row)

    def find(self, ref: str) -> Run:
        """A run by id (``12``) or label (the newest run with that label)."""
        run: Run | None = None
        if ref.isascii() and ref.isdigit():  # "²" is a digit to str.isdigit, not to int()
            run = self.get(int(ref))
        if run is None:
            with self._errors("read"):
                row = self._db.execute(f"SELECT {_COLUMNS} FROM runs WHERE label = ? ORDER BY id DESC LIMIT 1",
                                       (ref,)).fetchone()
            run = None if row is None else self._run(row)
        if run is None:
            raise LedgerError(f"no run {ref!r} in {self.path}", "gpuidle history lists ids and labels")
        return run

    def _run(self, row: tuple[Any, ...]) -> Run:
        (rid, kind, created, label, notes, host, gpu_model, gpu_count, batch, commit, dirty, util, step_s,
         report) = row
        inputs = [InputFile(str(p), s if isinstance(s, int) else None, h if isinstance(h, str) else None,
                            e if isinstance(e, str) else None)
                  for p, s, h, e in self._db.execute("SELECT path, size, sha256, etag FROM inputs WHERE run_id = ? "
                                                     "ORDER BY rowid", (rid,))]
        return Run(
            id=int(rid), kind=str(kind), created=str(created), label=_opt(label), notes=_opt(notes),
            host=_opt(host), gpu_model=_opt(gpu_model), gpu_count=gpu_count if isinstance(gpu_count, int) else None,
            batch_size=batch if isinstance(batch, int) else None, git_commit=_opt(commit),
            git_dirty=None if dirty is None else bool(dirty),
            utilization=float(util) if isinstance(util, int | float) else None,
            step_s=float(step_s) if isinstance(step_s, int | float) else None,
            inputs=inputs, report=str(report),
        )


def _opt(v: object) -> str | None:
    return None if v is None else str(v)


def record(
    kind: str,
    report_json: bytes | str,
    label: str | None = None,
    inputs: Sequence[str | Path | InputFile] = (),
    *,
    notes: str | None = None,
    gpu_model: str | None = None,
    gpu_count: int | None = None,
    batch_size: int | None = None,
    utilization: float | None = None,
    step_s: float | None = None,
    path: str | Path | None = None,
) -> int:
    """Record one run in the ledger at ``path`` (default: :func:`default_path`); return its id.

    :param kind: the command that measured it, one of :data:`KINDS`.
    :param report_json: the report as its command prints it with ``--json``.
    :param inputs: files read; each is stored with its size and SHA-256. An :class:`InputFile` is stored
        as given (a URL, described by ``gpuidle.api.describe_inputs``).
    :raises LedgerError: the ledger cannot be opened or written. Callers that record
        as a side effect should turn this into a warning, not a failure.
    """
    with Ledger(path) as book:
        return book.record(kind, report_json, label=label, notes=notes, inputs=inputs, gpu_model=gpu_model,
                           gpu_count=gpu_count, batch_size=batch_size, utilization=utilization, step_s=step_s)


def describe_input(path: str | Path) -> InputFile:
    """Size and SHA-256 of a file, read in blocks; None for both if it cannot be read."""
    p = Path(path)
    try:
        digest = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return InputFile(str(p.resolve()), p.stat().st_size, digest.hexdigest())
    except OSError:
        return InputFile(str(p), None, None)


def git_state(workdir: str | Path | None = None) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git working tree around ``workdir`` (default: the current directory).

    ``(None, None)`` outside a repository or without git. Untracked files do not count as dirty.
    Read without writing: a plain ``git status`` refreshes ``.git/index`` (through ``index.lock``)
    and can collide with the user's own git commands; ``--no-optional-locks`` leaves it alone.
    """
    cwd = str(workdir) if workdir is not None else os.getcwd()
    try:  # one git process: porcelain v2 heads its changes with the commit (``# branch.oid``)
        status = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain=v2", "--branch",
                                 "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=30,
                                check=False)
    except (OSError, subprocess.SubprocessError):
        return None, None
    if status.returncode != 0:
        return None, None
    lines = status.stdout.splitlines()
    commit = next((line.removeprefix("# branch.oid ") for line in lines if line.startswith("# branch.oid ")), None)
    if commit is None or commit == "(initial)":  # no commit yet
        return None, None
    return commit, any(not line.startswith("#") for line in lines)
