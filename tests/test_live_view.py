"""The live view: status lines pinned below the command's output, on a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import termios

from gpuidle.live.view import TerminalStatus
from gpuidle.model import GpuInfo, GpuSample, HostSample
from gpuidle.report.utilization import live_line_compact, live_lines

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode()


def test_status_lines_use_a_scroll_region() -> None:
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        # raw mode: the pty passes bytes as they are (no \n -> \r\n)
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        view = TerminalStatus(slave, lambda width, n: [f"line {i} of {n} at {width}" for i in range(n)], lines=3,
                              refresh_s=3600)
        view.start()
        view.stop()
        out = read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    # room for 3 lines, the scroll region above them, the cursor back where the output was
    assert out.startswith("\n\n\n\x1b7\x1b[1;27r\x1b8\x1b[3A")
    for i, row in enumerate((28, 29, 30)):
        assert f"\x1b[{row};1H\x1b[2Kline {i} of 3 at 100\x1b[0m" in out
    assert out.endswith("\x1b7\x1b[r\x1b[28;1H\x1b[2K\x1b[29;1H\x1b[2K\x1b[30;1H\x1b[2K\x1b8")


def test_small_terminal_gets_one_line() -> None:
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 8, 80, 0, 0))
        seen: list[int] = []
        view = TerminalStatus(slave, lambda width, n: seen.append(n) or ["x"], lines=9, refresh_s=3600)
        view.start()
        view.stop()
        read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert seen == [1]


def test_live_lines() -> None:
    gpus = [GpuInfo(index=0, mem_total_mib=8192.0), GpuInfo(index=1)]
    latest = {0: GpuSample(index=0, util_pct=72.0, mem_used_mib=1024.0, power_w=250.0, power_limit_w=400.0)}
    lines = [ANSI.sub("", x) for x in live_lines(gpus, latest, HostSample(cpu_pct=[20.0, 40.0]), 100, 42.0)]
    assert lines[0] == "gpuidle     42 s · CPU  30 % of 2"
    assert lines[1].startswith("GPU 0  ")
    assert lines[1].endswith("   72 %  mem 1.0/8.0 GiB  250/400 W")
    assert lines[2].startswith("GPU 1  ")
    assert lines[2].endswith("N/A")
    assert live_line_compact(gpus, latest, 80, 42.0) == "gpuidle 42 s · GPU ▆  72 % avg"
