"""``gpuidle run`` at the edges: commands that cannot start, zombies left behind, a piped stdout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from test_live_wrap import Run


def gpuidle_run(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", "run", "--quiet", "--no-ledger", "--no-dcgm",
                           "--out", str(tmp_path / "x.jsonl"), "--", *command], capture_output=True, text=True,
                          timeout=120)


def _not_executable(tmp_path: Path) -> tuple[str, str]:
    script = tmp_path / "train.sh"
    script.write_text("echo hello\n")
    script.chmod(0o644)
    return str(script), "permission denied"


def _a_folder(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path), "is a folder"


def _not_a_program(tmp_path: Path) -> tuple[str, str]:
    blob = tmp_path / "model.bin"
    blob.write_bytes(b"\x7fELF" + bytes(60))
    blob.chmod(0o755)
    return str(blob), "exec format error"


@pytest.mark.parametrize("make", [_not_executable, _a_folder, _not_a_program])
def test_a_command_found_but_not_executable_exits_126(tmp_path: Path,
                                                      make: Callable[[Path], tuple[str, str]]) -> None:
    command, why = make(tmp_path)
    shell = subprocess.run(["sh", "-c", '"$0"', command], capture_output=True)
    proc = gpuidle_run(tmp_path, command)
    assert proc.returncode == 126
    if why != "exec format error":  # a POSIX shell runs such a file as a script instead
        assert shell.returncode == 126
    assert proc.stderr.splitlines()[-1] == f"gpuidle: error: cannot execute {command}: {why}"
    assert not (tmp_path / "x.jsonl").exists()


def test_a_command_not_found_exits_127_as_in_a_shell(tmp_path: Path) -> None:
    shell = subprocess.run(["sh", "-c", "no-such-command-gpuidle"], capture_output=True)
    assert shell.returncode == gpuidle_run(tmp_path, "no-such-command-gpuidle").returncode == 127


ZOMBIE_HOLDER = """
import os, sys, time
zombie = os.posix_spawn("/bin/true", ["true"], os.environ)
while open(f"/proc/{zombie}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)
print(os.getpid(), zombie, flush=True)
time.sleep(120)
"""
"""A process that outlives the command, holding an exited child of its own that it never reaps."""

LEAVES_A_ZOMBIE = f"""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", {ZOMBIE_HOLDER!r}], stdout=subprocess.PIPE, text=True,
                             stderr=subprocess.DEVNULL)  # else gpuidle's stderr stays open until it is killed
    print(child.stdout.readline().strip(), flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_zombies_are_not_counted_as_still_running(tmp_path: Path) -> None:
    r = Run(tmp_path, LEAVES_A_ZOMBIE)
    code, out, _ = r.finish()
    living, zombie = (int(x) for x in out[0].split())
    try:
        assert code == 0
        notes = r.end()["notes"]
        assert isinstance(notes, list)
        assert f"1 process(es) of the command were still running at its exit: [{living}]" in notes
        assert zombie != living
    finally:
        os.kill(living, signal.SIGKILL)


def test_the_summary_leaves_the_commands_stdout_alone(tmp_path: Path) -> None:
    code = "print('line 1'); print('line 2')"
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "run", "--quiet", "--no-ledger", "--no-dcgm", "--json",
                           "--out", str(tmp_path / "r.jsonl"), "--", sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert proc.stdout == "line 1\nline 2\n"  # piped on: exactly what the command printed
    assert '"schema": "gpuidle.utilization/1"' in proc.stderr


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Deliver ``sig`` to one thread of ``pid`` (Linux's tgkill), as the kernel may pick any thread for a signal."""
    import ctypes
    import platform

    numbers = {"x86_64": 234, "aarch64": 131}
    if sys.platform != "linux" or platform.machine() not in numbers:
        pytest.skip("tgkill: Linux on x86_64 or aarch64")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[platform.machine()], pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_a_signal_the_kernel_hands_to_the_monitor_thread_is_forwarded(tmp_path: Path) -> None:
    """SIGTERM delivered to the sampling thread, not the main one: it only sets Python's flag, and the wrapper must
    still forward it promptly (its wait never blocks for good); before, the command waited forever."""
    code = """
        import signal, sys
        signal.signal(signal.SIGTERM, lambda s, f: (print("command TERM", flush=True), sys.exit(0)))
        print("ready", flush=True)
        signal.pause()
    """
    r = Run(tmp_path, code)
    assert r.line() == "ready"
    tids = [int(t) for t in os.listdir(f"/proc/{r.proc.pid}/task") if int(t) != r.proc.pid]
    assert tids, "the wrapper runs a sampling thread"
    _tgkill(r.proc.pid, tids[0], signal.SIGTERM)
    try:
        out, _ = r.proc.communicate(timeout=60)  # a hang guard, not a performance bound
    except subprocess.TimeoutExpired:
        r.proc.kill()
        raise
    assert r.proc.returncode == 0
    assert out.splitlines() == ["command TERM"]
