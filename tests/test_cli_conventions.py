"""CLI conventions: colour (``--color``, ``NO_COLOR``), formats chosen by ``--out``, what start-up imports."""

from __future__ import annotations

import json
import os
import platform
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA

TRACE = str(DATA / "trace_compare__base__base.json.gz")
ESC = "\x1b["


def gpuidle(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def on_a_terminal(*args: str, env: dict[str, str]) -> str:
    """Run with stdout on a pseudo-terminal and return what it printed."""
    leader, follower = pty.openpty()
    base = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.Popen([sys.executable, "-m", "gpuidle", *args], stdout=follower, stderr=subprocess.DEVNULL,
                            env={**base, **env})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the follower closed: the child is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait()
    os.close(leader)
    assert proc.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_colour_on_a_terminal_and_none_under_no_color() -> None:
    assert ESC in on_a_terminal("analyze", TRACE, "--no-ledger", env={})
    assert ESC not in on_a_terminal("analyze", TRACE, "--no-ledger", env={"NO_COLOR": "1"})
    assert ESC not in on_a_terminal("analyze", TRACE, "--no-ledger", "--color", "never", env={})
    assert ESC in on_a_terminal("analyze", TRACE, "--no-ledger", "--color", "always", env={"NO_COLOR": "1"})


def test_color_always_into_a_pipe_and_never_by_default() -> None:
    assert ESC in gpuidle("analyze", TRACE, "--no-ledger", "--color", "always").stdout
    assert ESC in gpuidle("--color", "always", "analyze", TRACE, "--no-ledger").stdout
    assert ESC not in gpuidle("analyze", TRACE, "--no-ledger").stdout


@pytest.mark.parametrize(("name", "check"), [
    ("report.html", lambda text: text.lstrip().lower().startswith("<!doctype html>")),
    ("report.md", lambda text: text.startswith("#")),
    ("report.json", lambda text: json.loads(text)["schema"] == "gpuidle.analysis/1"),
    ("report.txt", lambda text: "utilization" in text and ESC not in text),
])
def test_out_picks_the_format_from_its_extension(tmp_path: Path, name: str, check: object) -> None:
    out = tmp_path / name
    proc = gpuidle("analyze", TRACE, "--no-ledger", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert callable(check)
    assert check(out.read_text())


@pytest.mark.parametrize("args", [
    ("--format", "md", "--out", "r.json"),
    ("--json", "--format", "md"),
    ("--out", "r.xyz"),
    ("--format", "terminal", "--out", "r.html"),
])
def test_conflicting_or_unknown_formats_are_refused(tmp_path: Path, args: tuple[str, ...]) -> None:
    args = tuple(str(tmp_path / a) if a.startswith("r.") else a for a in args)
    proc = gpuidle("analyze", TRACE, "--no-ledger", *args)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuidle: error:")
    assert not any(p.name.startswith("r.") for p in tmp_path.iterdir())


NOT_ON_THE_JSON_PATH = (
    "sqlite3", "hashlib", "rich", "gpuidle.ledger", "gpuidle.report.html", "gpuidle.report.terminal", "gpuidle.live",
    "gpuidle.probes", "gpuidle.sources.smi", "gpuidle.analysis.utilization", "torch", "concurrent.futures.process",
    # the other formats' readers, and what only they or remote inputs need
    "gpuidle.sources.xspace", "gpuidle.sources.xplanes", "gpuidle.sources.nsys", "google.protobuf", "fsspec",
    "subprocess", "tempfile",
    # what numpy and argparse import on first use of np.unique and of a help formatter's width: 12 ms of a start
    "numpy.ma", "shutil",
    # a cluster: only with --scheduler, DASK_SCHEDULER_ADDRESS or Dask's configuration
    "dask", "distributed", "gpuidle.jobs.cluster",
)


@pytest.mark.parametrize("trace", [TRACE, str(DATA / "negative_queue_length_values_check__rank0.json.gz")],
                         ids=["small", "a100-26mib"])
def test_analyze_json_imports_only_what_it_uses(trace: str) -> None:
    code = ("import sys, io, contextlib\n"
            "from gpuidle.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['analyze', '--json', '--no-ledger', {trace!r}]) == 0\n"
            "print('\\n'.join(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert "gpuidle.analysis.idle" in loaded
    leaked = sorted(m for m in loaded if any(m == bad or m.startswith(bad + ".") for bad in NOT_ON_THE_JSON_PATH))
    assert leaked == []


def test_importing_the_cli_loads_no_subcommand() -> None:
    code = "import sys, gpuidle.cli; print('\\n'.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert not {"numpy", "msgspec", "gpuidle.api", "gpuidle.cli.analyze"} & loaded


def test_the_process_entry_sets_the_collector_for_a_short_process_and_main_leaves_it_alone() -> None:
    code = ("import gc, io, contextlib, sys\n"
            "from gpuidle.cli import COLLECT_EVERY, main, run\n"
            "before = gc.get_threshold()\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['analyze', '--json', '--no-ledger', {TRACE!r}]) == 0\n"
            "assert gc.get_threshold() == before and gc.get_freeze_count() == 0\n"
            f"sys.argv = ['gpuidle', 'analyze', '--json', '--no-ledger', {TRACE!r}]\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert run() == 0\n"
            "assert gc.get_threshold() == (COLLECT_EVERY, *before[1:]), gc.get_threshold()\n"
            "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="the allocator setting is glibc's")
def test_the_process_entry_keeps_freed_memory_and_main_does_not() -> None:
    code = ("import io, contextlib, os, sys\n"
            "from gpuidle.cli import main, run\n"
            "def rss():\n"
            "    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
            "def kept():\n"
            "    before = rss()\n"
            "    block = bytearray(200 << 20)\n"
            "    del block\n"
            "    return rss() - before\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['analyze', '--json', '--no-ledger', {TRACE!r}]) == 0\n"
            "assert kept() < 50 << 20, kept()\n"
            f"sys.argv = ['gpuidle', 'analyze', '--json', '--no-ledger', {TRACE!r}]\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert run() == 0\n"
            "assert kept() > 150 << 20, kept()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="numpy marks huge pages on Linux only")
@pytest.mark.parametrize("user_says", [None, "1"])
def test_the_process_entry_turns_numpys_huge_pages_off_unless_the_user_chose(user_says: str | None) -> None:
    code = ("import io, contextlib, sys\n"
            "from numpy._core.multiarray import _set_madvise_hugepage as huge_pages\n"
            "from gpuidle.cli import main, run\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['analyze', '--json', '--no-ledger', {TRACE!r}]) == 0\n"
            "assert huge_pages(True) is True\n"  # main() leaves numpy as it found it
            f"sys.argv = ['gpuidle', 'analyze', '--json', '--no-ledger', {TRACE!r}]\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert run() == 0\n"
            f"assert huge_pages(True) is {user_says is not None}\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if user_says is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = user_says
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_version_answers_without_loading_the_commands_or_numpy() -> None:
    """``gpuidle --version`` says what argparse would say, in the time the interpreter takes to start: no
    subcommand's module, no numpy."""
    code = ("import io, contextlib, sys\n"
            "from gpuidle.cli import run\n"
            "sys.argv = ['gpuidle', '--version']\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    assert run() == 0\n"
            "assert 'numpy' not in sys.modules and 'gpuidle.cli.analyze' not in sys.modules, sorted(sys.modules)\n"
            "print(out.getvalue(), end='')\n")
    proc = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    import gpuidle

    assert proc.stdout == f"gpuidle {gpuidle.__version__}\n"
    # with a subcommand or --help, argparse has the word as before
    help_and_version = subprocess.run([sys.executable, "-m", "gpuidle", "--help", "--version"], capture_output=True,
                                      text=True, check=False)
    assert help_and_version.returncode == 0
    assert help_and_version.stdout.startswith("usage: gpuidle")
