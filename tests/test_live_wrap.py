"""``gpuidle run`` for real, on CPU: exit codes, signal forwarding, crashes, children that take their time.

Each test runs the CLI in its own process with a small Python program as the command,
and talks to that program through its output lines, so no test depends on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuidle.live import nvml
from gpuidle.live.wrap import exit_code


def nvml_works() -> bool:
    try:
        nvml.init()
    except nvml.NvmlUnavailable:
        return False
    return True


class Run:
    """``gpuidle run --quiet ... -- python -c CODE`` in a child process."""

    def __init__(self, tmp_path: Path, code: str, *options: str) -> None:
        self.log = tmp_path / "run.jsonl"
        self.summary = tmp_path / "summary.json"
        cmd = [sys.executable, "-m", "gpuidle", "run", "--quiet", "--interval", "0.1", "--no-dcgm",
               "--out", str(self.log), "--summary", str(self.summary), "--json", *options,
               "--", sys.executable, "-c", textwrap.dedent(code)]
        # SIGINT as a terminal gives it: a test run started in the background by a shell inherits it ignored,
        # and the command would inherit that too
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self) -> tuple[int, list[str], str]:
        out, err = self.proc.communicate()
        return self.proc.returncode, out.splitlines(), err

    def records(self) -> list[dict[str, object]]:
        return [json.loads(x) for x in self.log.read_text().splitlines()]

    def end(self) -> dict[str, object]:
        last = self.records()[-1]
        assert last["type"] == "end"
        return last


def test_exit_code_passthrough_and_cpu_side_summary(tmp_path: Path) -> None:
    r = Run(tmp_path, "import sys; print('hello', flush=True); sys.exit(3)")
    code, out, err = r.finish()
    assert code == 3
    assert out == ["hello"]
    assert "the command exited with code 3" in err
    assert r.end()["exit_code"] == 3
    report = json.loads(r.summary.read_text())
    assert report["schema"] == "gpuidle.utilization/1"
    assert report["source"]["exit_code"] == 3
    assert report["host"]["cores"] == os.cpu_count()
    if not nvml_works():
        assert report["devices"] == []
        assert "NVML" in report["gpu_unavailable"]
        assert "sampling the CPU side only" in err


def test_crashing_command(tmp_path: Path) -> None:
    r = Run(tmp_path, "raise RuntimeError('boom')")
    code, _, err = r.finish()
    assert code == 1
    assert "RuntimeError: boom" in err
    assert r.end()["exit_code"] == 1
    assert json.loads(r.summary.read_text())["source"]["exit_code"] == 1


def test_command_killed_by_a_signal(tmp_path: Path) -> None:
    r = Run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    code, _, _ = r.finish()
    assert code == 128 + signal.SIGKILL
    assert exit_code(-9) == 137
    assert exit_code(0) == 0
    assert exit_code(2) == 2


HANDLES_TERM = """
    import signal, sys, time
    def on_term(sig, frame):
        print("TERM", flush=True)
        time.sleep(0.3)          # a second forwarded copy would arrive meanwhile
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        signal.pause()
"""


def test_sigterm_is_forwarded_once(tmp_path: Path) -> None:
    r = Run(tmp_path, HANDLES_TERM)
    assert r.line() == "ready"
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0
    assert out == ["TERM"]
    assert r.end()["exit_code"] == 0


def test_sigint_reaches_the_command(tmp_path: Path) -> None:
    r = Run(tmp_path, "import time; print('ready', flush=True); time.sleep(600)")
    assert r.line() == "ready"
    r.signal(signal.SIGINT)
    code, _, err = r.finish()
    assert code == 128 + signal.SIGINT  # Python's KeyboardInterrupt exit
    assert "KeyboardInterrupt" in err
    assert "SIGINT forwarded to the command" in err


GRANDCHILD = "; ".join([
    "import signal, sys",
    "signal.signal(signal.SIGTERM, lambda s, f: (print('grandchild TERM', flush=True), sys.exit(0)))",
    "print('grandchild ready', flush=True)",
    "signal.pause()",
])


def test_signal_reaches_the_whole_process_tree(tmp_path: Path) -> None:
    code = f"""
        import signal, subprocess, sys
        grandchild = subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}], stdout=subprocess.PIPE, text=True)
        signal.signal(signal.SIGTERM, lambda s, f: print("child TERM", flush=True))
        print(grandchild.stdout.readline().strip(), flush=True)
        print("ready", flush=True)
        print(grandchild.stdout.readline().strip(), flush=True)
        sys.exit(grandchild.wait())
    """
    r = Run(tmp_path, code)
    assert r.line() == "grandchild ready"
    assert r.line() == "ready"
    r.signal(signal.SIGTERM)
    code_, out, _ = r.finish()
    assert code_ == 0
    assert sorted(out) == ["child TERM", "grandchild TERM"]


def test_command_that_outlives_the_signal(tmp_path: Path) -> None:
    code = """
        import signal, sys, time
        stopping = []
        signal.signal(signal.SIGTERM, lambda s, f: stopping.append(s))
        print("ready", flush=True)
        while not stopping:
            signal.pause()
        print("saving checkpoint", flush=True)
        time.sleep(0.5)
        print("saved", flush=True)
        sys.exit(7)
    """
    r = Run(tmp_path, code)
    assert r.line() == "ready"
    r.signal(signal.SIGTERM)
    code_, out, err = r.finish()
    assert code_ == 7
    assert out == ["saving checkpoint", "saved"]
    assert "waiting for it to exit" in err
    recs = r.records()
    assert recs[-1]["exit_code"] == 7
    assert sum(1 for x in recs if x["type"] == "sample") >= 2  # sampling went on while it saved


IGNORES_TERM = """
    import signal, time
    signal.signal(signal.SIGTERM, lambda s, f: print("ignored", flush=True))
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""


def test_kill_after(tmp_path: Path) -> None:
    r = Run(tmp_path, IGNORES_TERM, "--kill-after", "0.3")
    assert r.line() == "ready"
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 128 + signal.SIGKILL
    assert out == ["ignored"]
    end = r.end()
    assert end["exit_code"] == 137
    assert "gpuidle killed the command's process group" in end["notes"]


def test_third_signal_kills(tmp_path: Path) -> None:
    r = Run(tmp_path, IGNORES_TERM)
    assert r.line() == "ready"
    r.signal(signal.SIGTERM)
    assert r.line() == "ignored"
    r.signal(signal.SIGTERM)
    assert r.line() == "ignored"
    r.signal(signal.SIGTERM)
    code, out, err = r.finish()
    assert code == 137
    assert out == []
    assert "again to kill it" in err


def test_command_not_found(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "run", "--quiet", "--out", str(tmp_path / "x.jsonl"),
                           "--", "no-such-command-gpuidle"], capture_output=True, text=True)
    assert proc.returncode == 127
    assert proc.stderr.splitlines()[-1] == "gpuidle: error: command not found: no-such-command-gpuidle"
    assert not (tmp_path / "x.jsonl").exists()


def test_no_command() -> None:
    from gpuidle.cli import main

    assert main(["run", "--quiet"]) == 2
    with pytest.raises(SystemExit):
        main(["run", "--help"])
