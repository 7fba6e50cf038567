"""``gpuidle run -- CMD``: start a command, sample while it runs, hand back its exit code.

The command runs in a process group of its own, so a signal reaches it exactly once:
a Ctrl-C in the terminal goes to gpuidle's group only, and gpuidle forwards it (and
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, as batch schedulers send them) to the whole
group, where torchrun and its workers receive it. The command is free to take its time
to stop (saving a checkpoint); gpuidle keeps sampling until it exits. A third SIGINT or
SIGTERM, or ``kill_after_s`` seconds after the first, kills the group.

The exit code is the command's; killed by signal N it is ``128 + N``, as a shell says;
a command that cannot start gives a shell's codes too: 127 not found, 126 found but not
executable (no execute permission, a folder, not a program).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from gpuidle.errors import GpuidleError
from gpuidle.live.monitor import Monitor, Sink
from gpuidle.model import MonitorSample

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM)
SIGNAL_POLL_S = 0.2
"""The longest the command's wait blocks at a time, so that a signal is forwarded within it whichever thread the
kernel delivered it to."""
KILL_ON_NTH = 3
"""The third SIGINT/SIGTERM kills the command's whole process group."""


class CommandCannotStart(GpuidleError):
    """The command to wrap cannot be started; :attr:`exit_code` is what a shell would return."""

    exit_code = 126


class CommandNotFound(CommandCannotStart):
    """No such command (exit code 127, as a shell)."""

    exit_code = 127


class CommandNotExecutable(CommandCannotStart):
    """The command exists but cannot be executed (exit code 126, as a shell)."""


@dataclass(slots=True)
class RunResult:
    exit_code: int
    forwarded: list[int] = field(default_factory=list)
    """Signals forwarded to the command, in order."""
    killed: bool = False
    """gpuidle killed the group (third signal, or ``kill_after_s``)."""
    duration_s: float = 0.0


class DeviceUse:
    """A monitor sink: which GPUs hold a context of the command's process tree.

    ``tree`` returns the tree's pids; NVML lists the pids with a context on each device.
    """

    def __init__(self, tree: Callable[[], set[int]]) -> None:
        self.tree = tree
        self.devices: set[int] = set()
        self.seen_any = False

    def __call__(self, s: MonitorSample) -> None:
        pids = None
        for g in s.gpus:
            if g.pids is None:
                continue
            self.seen_any = True
            if pids is None:
                pids = self.tree()
            if pids & set(g.pids):
                self.devices.add(g.index)


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: ``-N`` (killed by signal N) becomes ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


class Runner:
    """Runs one command under a monitor. :meth:`start`, then :meth:`wait`; signals are forwarded meanwhile."""

    def __init__(self, cmd: Sequence[str], kill_after_s: float | None = None, env: dict[str, str] | None = None,
                 on_signal: Callable[[int, int], None] | None = None) -> None:
        if not cmd:
            raise GpuidleError("no command to run", "gpuidle run -- python train.py ...")
        self.cmd = list(cmd)
        self.kill_after_s = kill_after_s
        self.env = env
        self.on_signal = on_signal
        """Called as ``(signal, count)`` when a stopping signal arrives (for a message to the user)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.result = RunResult(exit_code=0)
        self._stops = 0
        self._first_stop: float | None = None
        self._previous: dict[int, object] = {}
        self._pending: list[int] = []
        self._t0 = 0.0

    def start(self) -> int:
        """Start the command in its own process group; returns its pid.

        The handlers go in first, so a signal that arrives while the command starts is
        forwarded as soon as it exists rather than lost (or killing gpuidle alone).
        """
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED:
                self._previous[sig] = signal.signal(sig, self._forward)
        try:
            self.proc = subprocess.Popen(self.cmd, process_group=0, env=self.env)
        except FileNotFoundError:
            self.restore()
            raise CommandNotFound(f"command not found: {self.cmd[0]}") from None
        except OSError as err:  # EACCES: no execute permission, or a folder; ENOEXEC: not a program
            self.restore()
            what = "is a folder" if os.path.isdir(self.cmd[0]) else (err.strerror or "cannot execute").lower()
            raise CommandNotExecutable(f"cannot execute {self.cmd[0]}: {what}") from None
        self._t0 = time.monotonic()
        pending, self._pending = self._pending, []
        for signum in pending:
            self._forward(signum, None)
        return self.proc.pid

    def _forward(self, sig: int, frame: FrameType | None) -> None:
        proc = self.proc
        if proc is None:
            self._pending.append(sig)
            return
        if proc.returncode is not None:
            return
        self.result.forwarded.append(sig)
        if sig in STOPPING:
            self._stops += 1
            if self._first_stop is None:
                self._first_stop = time.monotonic()
            if self.on_signal is not None:
                self.on_signal(sig, self._stops)
            if self._stops >= KILL_ON_NTH:
                self.kill()
                return
        self._signal_group(sig)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        self.result.killed = True
        self._signal_group(signal.SIGKILL)

    def wait(self) -> RunResult:
        """Wait for the command (forwarding signals meanwhile); restore signal handlers; return its result."""
        proc = self.proc
        if proc is None:
            raise GpuidleError("the command was not started")
        try:
            while True:
                # never block without end: a signal the kernel hands to another thread (the monitor's) only sets
                # Python's flag, and its handler runs when this thread next runs Python, not while it waits
                timeout = SIGNAL_POLL_S
                if self.kill_after_s is not None and not self.result.killed and self._first_stop is not None:
                    # after the first stopping signal, sleep no later than the deadline
                    timeout = min(SIGNAL_POLL_S, max(0.0, self._first_stop + self.kill_after_s - time.monotonic()))
                try:
                    proc.wait(timeout=timeout)
                    break
                except subprocess.TimeoutExpired:
                    if self._first_stop is not None and self.kill_after_s is not None and not self.result.killed \
                            and time.monotonic() >= self._first_stop + self.kill_after_s:
                        self.kill()
        finally:
            self.restore()
        self.result.exit_code = exit_code(proc.returncode)
        self.result.duration_s = time.monotonic() - self._t0
        return self.result

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def survivors(self) -> list[int]:
        """Processes still running in the command's group after it exited (they may hold GPUs).

        A zombie (exited, not yet reaped by its parent) holds nothing and is not counted.
        """
        if self.proc is None:
            return []
        out = []
        try:
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        if os.getpgid(int(name)) == self.proc.pid and _running(int(name)):
                            out.append(int(name))
                    except (ProcessLookupError, PermissionError):
                        continue
        except OSError:
            return []
        return sorted(out)


def _running(pid: int) -> bool:
    """Whether ``pid`` is neither a zombie nor dead (``/proc/PID/stat``: the state after the name)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 1:].split()
    return bool(fields) and fields[0] not in (b"Z", b"X")


def run_monitored(runner: Runner, monitor: Monitor, sinks: Sequence[Sink],
                  on_start: Callable[[int], None] | None = None) -> RunResult:
    """Start the command, sample until it exits, stop sampling. ``on_start(pid)`` runs before sampling starts."""
    pid = runner.start()
    try:
        if on_start is not None:
            on_start(pid)
        monitor.start(sinks)
    except BaseException:
        runner.kill()
        runner.wait()
        raise
    try:
        return runner.wait()
    finally:
        monitor.stop()
