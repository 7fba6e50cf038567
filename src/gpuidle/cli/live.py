"""``gpuidle monitor``, ``run -- CMD`` and ``summarize LOG``: device counters, live and after the fact."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence

import msgspec

from gpuidle import api
from gpuidle.cli.common import (
    Parser,
    add_ledger_option,
    emit,
    positive_float,
    positive_int,
    record_run,
    refuse_overwriting_inputs,
    render_options,
    warn,
)
from gpuidle.errors import GpuidleError
from gpuidle.live.dcgm import dcgm_reader
from gpuidle.live.exporter import Exporter, LatestSample, node_name, series_labels
from gpuidle.live.host import PsutilHost
from gpuidle.live.monitor import (
    MIN_INTERVAL_S,
    GpuBackend,
    HostBackend,
    JsonlWriter,
    Monitor,
    Sink,
    default_log_path,
    nvml_backend,
)
from gpuidle.live.view import TerminalStatus
from gpuidle.live.wrap import CommandCannotStart, DeviceUse, Runner, run_monitored
from gpuidle.model import HostSample, MonitorEnd, MonitorHeader, UtilizationReport
from gpuidle.report.utilization import UTIL_RENDERERS, live_line_compact, live_lines, util_renderer_for

GPU_BACKEND: Callable[[], GpuBackend] = nvml_backend
"""Where GPU samples come from; tests put a recorded backend here."""
HOST_BACKEND: Callable[[int | None], HostBackend] = PsutilHost
"""``(root pid) -> host probe``."""


def interval(text: str) -> float:
    value = positive_float(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{value} is below the minimum interval, {MIN_INTERVAL_S} s")
    return value


def device_list(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices, e.g. 0,1,3") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices, e.g. 0,1,3")
    return out


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank (0, 1, 2, ...)")
    return value


def _sampling_options(p: argparse.ArgumentParser, default_interval: float) -> None:
    p.add_argument("--interval", type=interval, default=default_interval, metavar="S",
                   help=f"seconds between samples, at least {MIN_INTERVAL_S} (default {default_interval:g})")
    p.add_argument("--devices", type=device_list, metavar="0,1,...", help="sample only these GPU indices")
    p.add_argument("--dcgm-url", metavar="URL",
                   help="a dcgm-exporter endpoint for SM_ACTIVE and friends (http://host:9400/metrics)")
    p.add_argument("--no-dcgm", action="store_true", help="do not run dcgmi dmon even when it is on PATH")
    p.add_argument("--prometheus-port", type=port, metavar="PORT", help="serve the latest sample for Prometheus")
    p.add_argument("--prometheus-addr", default="127.0.0.1", metavar="ADDR",
                   help="address the exporter listens on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--job", metavar="NAME", help="a job label on every exported series (with --prometheus-port)")
    p.add_argument("--rank", type=rank, metavar="N", help="a rank label on every exported series "
                                                          "(with --prometheus-port)")
    p.add_argument("--quiet", action="store_true", help="no live view")


def _summary_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps-per-s", type=positive_float, metavar="X",
                   help="training steps per second, to give periods and gains in steps")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (same as --format json)")
    p.add_argument("--format", choices=sorted(UTIL_RENDERERS), help="summary format (default: terminal)")
    p.add_argument("--top", type=positive_int, default=3, help="recommendations to show (default 3)")
    p.add_argument("--label", help="name this run in the ledger, e.g. 'prefetch on' (for gpuidle history)")
    add_ledger_option(p)


def register(sub: argparse._SubParsersAction[Parser]) -> None:
    mon = sub.add_parser(
        "monitor", help="sample GPU and host counters until Ctrl-C, then summarise",
        description="Sample every GPU (NVML) and the host (psutil) at a fixed interval until Ctrl-C or "
                    "--duration; write a JSONL log and print a utilization summary.")
    _sampling_options(mon, 1.0)
    mon.add_argument("--out", metavar="FILE", help="write the samples to FILE (JSONL); default: no log kept")
    mon.add_argument("--duration", type=positive_float, metavar="S", help="stop after S seconds")
    mon.add_argument("--count", type=positive_int, metavar="N", help="stop after N samples")
    mon.add_argument("--no-summary", action="store_true", help="print no summary at the end")
    _summary_options(mon)
    mon.set_defaults(func=monitor_command)

    run = sub.add_parser(
        "run", help="run a training command, sample while it runs, summarise at exit",
        description="Run CMD, forward signals to it, sample the GPUs its processes use (or --devices) and the "
                    "host for the whole run, write the log, print a summary at exit, and exit with CMD's code.",
        usage="gpuidle run [options] -- CMD [ARG ...]")
    _sampling_options(run, 0.5)
    run.add_argument("--out", metavar="FILE", help="the JSONL log (default: gpuidle-run-<time>.jsonl here)")
    run.add_argument("--summary", metavar="FILE", help="write the summary to FILE instead of stderr")
    run.add_argument("--kill-after", type=positive_float, metavar="S",
                     help="kill the command S seconds after the first forwarded SIGINT/SIGTERM "
                          "(default: wait; a third signal kills)")
    _summary_options(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command, after --")
    run.set_defaults(func=run_command)

    sm = sub.add_parser(
        "summarize", help="summarise a utilization log: gpuidle JSONL, nvidia-smi CSV or dmon",
        description="Analyse a log after the fact: gpuidle monitor/run JSONL, nvidia-smi --query-gpu CSV "
                    "(-l/-lms, with or without header and units), or nvidia-smi dmon output.")
    sm.add_argument("path", metavar="LOG", help="the log file (.jsonl, .csv, dmon text; .gz too)")
    sm.add_argument("--fields", metavar="F1,F2,...",
                    help="the --query-gpu field list, for a CSV recorded with noheader")
    sm.add_argument("--interval", type=positive_float, metavar="S",
                    help="the -d of a dmon log without Date/Time columns (default 1)")
    sm.add_argument("--devices", type=device_list, metavar="0,1,...", help="analyse only these GPU indices")
    sm.add_argument("--out", metavar="FILE", help="write the summary to FILE")
    _summary_options(sm)
    sm.set_defaults(func=summarize_command)


# ----------------------------------------------------------------------------------
# The library face of these commands
# ----------------------------------------------------------------------------------


def _render(report: UtilizationReport, args: argparse.Namespace, out: str | None, to_stderr: bool = False) -> None:
    """To the file ``out``, else stdout, or stderr with ``to_stderr``."""
    fmt = "json" if args.json else args.format
    renderer = util_renderer_for(fmt, out)()
    stream = sys.stderr if to_stderr else sys.stdout
    to_tty = out is None and stream.isatty()
    text = renderer.render(report, render_options(args, to_tty, top=args.top))
    if out is None and to_stderr:
        stream.write(text)
    else:
        emit(text, out)


def summarize_command(args: argparse.Namespace) -> int:
    fields = [f for f in args.fields.split(",") if f.strip()] if args.fields else None
    refuse_overwriting_inputs([args.path], {"--out": args.out})
    report = api.summarize_log(args.path, fields, args.interval, args.devices, args.steps_per_s)
    _render(report, args, args.out)
    _record(args, "summarize", report, [args.path])
    return 0


def _record(args: argparse.Namespace, kind: str, report: UtilizationReport, inputs: Sequence[str] = (),
            notes: str | None = None) -> None:
    """Keep the summary in the ledger, with the GPUs it covers; a ledger problem is only a warning."""
    facts = api.utilization_facts(report)
    facts["notes"] = notes
    record_run(args, kind, msgspec.json.encode(report), args.label, inputs, **facts)


# ----------------------------------------------------------------------------------
# monitor and run
# ----------------------------------------------------------------------------------


def _host(root_pid: int | None) -> HostBackend | None:
    try:
        return HOST_BACKEND(root_pid)
    except GpuidleError as err:
        warn(f"no host metrics: {err}")
        return None


def _view(header: MonitorHeader, latest: LatestSample, quiet: bool, t0: float,
          clock: Callable[[], float]) -> TerminalStatus | None:
    if quiet or not sys.stdout.isatty():
        return None

    def render(width: int, max_lines: int) -> list[str]:
        gpus = latest.gpu_samples()
        _, _, cpu, _ = latest.snapshot()
        host = HostSample(cpu_pct=cpu) if cpu else None
        elapsed = clock() - t0
        if max_lines < len(header.gpus) + 1:
            return [live_line_compact(header.gpus, gpus, width, elapsed)]
        return live_lines(header.gpus, gpus, host, width, elapsed, header.gpu_unavailable)

    return TerminalStatus(sys.stdout.fileno(), render, lines=len(header.gpus) + 1)


@contextlib.contextmanager
def _serving(args: argparse.Namespace) -> Iterator[Exporter | None]:
    """The exporter, listening before anything else starts: a bad address or a busy port stops the command
    before it samples or runs anything."""
    if not args.prometheus_port:
        if args.job is not None or args.rank is not None:
            raise GpuidleError("--job and --rank label the exported series", "add --prometheus-port")
        yield None
        return
    exp = Exporter(args.prometheus_port, args.prometheus_addr, series_labels(node_name(), args.job, args.rank))
    print(f"gpuidle: serving metrics on http://{_host_port(args.prometheus_addr, exp.port)}/metrics",
          file=sys.stderr)
    try:
        yield exp
    finally:
        exp.close()


def _host_port(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _summarize_log(path: str, args: argparse.Namespace, out: str | None, to_stderr: bool = False
                   ) -> UtilizationReport:
    report = api.summarize_log(path, devices=args.devices, steps_per_s=args.steps_per_s)
    _render(report, args, out, to_stderr)
    return report


def _monitor_summary(path: str, args: argparse.Namespace) -> UtilizationReport | None:
    """The summary printed at the end; with ``--no-summary``, computed for the ledger only, where
    a log too short to summarise is a warning rather than an error."""
    if not args.no_summary:
        return _summarize_log(path, args, None)
    if args.no_ledger:
        return None
    try:
        return api.summarize_log(path, devices=args.devices, steps_per_s=args.steps_per_s)
    except GpuidleError as err:
        warn(f"the run was not recorded in the ledger: {err}")
        return None


def monitor_command(args: argparse.Namespace) -> int:
    with _serving(args) as exporter:
        return _monitor(args, exporter)


def _monitor(args: argparse.Namespace, exporter: Exporter | None) -> int:
    host = _host(None)
    gpu = GPU_BACKEND()
    dcgm = dcgm_reader(args.dcgm_url, not args.no_dcgm)
    monitor = Monitor(gpu, host, args.interval, dcgm=dcgm, devices=args.devices)
    header = monitor.open()
    if header.gpu_unavailable is not None:
        monitor.stop()
        raise GpuidleError(header.gpu_unavailable, "gpuidle run still samples the CPU side")
    keep = args.out is not None
    if not keep and args.no_summary and args.no_ledger:
        _export_only(monitor, header, exporter, args)
        return 0
    path = args.out or tempfile.mkstemp(prefix="gpuidle-monitor-", suffix=".jsonl")[1]
    writer = JsonlWriter(path)
    writer.header(header)
    latest = LatestSample(header)
    if exporter is not None:
        exporter.publish(latest)
    try:
        with _stopping_on_signals() as stop:
            _sample(monitor, header, latest, [writer, latest], stop, args)
            writer.close(MonitorEnd(t=monitor.clock.time(), samples=writer.samples, notes=monitor.notes()))
        if keep:
            print(f"gpuidle: {writer.samples} samples written to {path}", file=sys.stderr)
        report = _monitor_summary(path, args)
        if report is not None:
            _record(args, "monitor", report, [path] if keep else [])
    finally:
        writer.close()
        if not keep:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


def _export_only(monitor: Monitor, header: MonitorHeader, exporter: Exporter | None,
                 args: argparse.Namespace) -> None:
    """No log, no summary, no ledger record: a long-running exporter keeps nothing on disk."""
    latest = LatestSample(header)
    if exporter is not None:
        exporter.publish(latest)
    with _stopping_on_signals() as stop:
        _sample(monitor, header, latest, [latest], stop, args)


@contextlib.contextmanager
def _stopping_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM stop at the next tick, so the log ends on a whole line; a second signal stops at once."""
    stop = threading.Event()

    def on_stop(sig: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sample(monitor: Monitor, header: MonitorHeader, latest: LatestSample, sinks: list[Sink],
            stop: threading.Event, args: argparse.Namespace) -> None:
    """Sample until ``stop``, ``--count`` or ``--duration``, with the live view when there is one."""
    view = _view(header, latest, args.quiet, header.t0, monitor.clock.time)
    if view is not None:
        view.start()
    try:
        monitor.run(sinks, stop, max_samples=args.count, duration_s=args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        if view is not None:
            view.stop()
        monitor.stop()


def run_command(args: argparse.Namespace) -> int:
    with _serving(args) as exporter:
        return _run(args, exporter)


def _run(args: argparse.Namespace, exporter: Exporter | None) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise GpuidleError("no command to run", "gpuidle run -- python train.py ...")
    host = _host(None)
    try:
        gpu: GpuBackend | None = GPU_BACKEND()
    except GpuidleError as err:
        gpu = None
        warn(str(err))
    dcgm = dcgm_reader(args.dcgm_url, not args.no_dcgm) if gpu is not None else None
    monitor = Monitor(gpu, host, args.interval, dcgm=dcgm, devices=args.devices, command=cmd)
    header = monitor.open("no GPU backend" if gpu is None else None)
    if header.gpu_unavailable:
        warn(f"GPUs unavailable ({header.gpu_unavailable}): sampling the CPU side only")
    path = args.out or default_log_path("gpuidle-run")
    writer = JsonlWriter(path)
    writer.header(header)
    latest = LatestSample(header)
    use = DeviceUse(host.tree_pids if isinstance(host, PsutilHost) else (lambda: set()))
    view = _view(header, latest, args.quiet, header.t0, monitor.clock.time)

    def on_signal(sig: int, count: int) -> None:
        name = signal.Signals(sig).name
        hint = "again to kill it" if count == 2 else "again to force" if count == 1 else ""
        print(f"\ngpuidle: {name} forwarded to the command; waiting for it to exit" + (f" ({hint})" if hint else ""),
              file=sys.stderr)

    def on_start(pid: int) -> None:
        if isinstance(host, PsutilHost):
            host.root_pid = pid
        if view is not None:
            view.start()

    runner = Runner(cmd, kill_after_s=args.kill_after, on_signal=on_signal)
    if exporter is not None:
        exporter.publish(latest)
    try:
        try:
            result = run_monitored(runner, monitor, [writer, latest, use], on_start)
        finally:
            if view is not None:
                view.stop()
    except CommandCannotStart as err:
        writer.close(MonitorEnd(t=monitor.clock.time(), samples=writer.samples, exit_code=err.exit_code,
                                notes=[str(err)]))
        with contextlib.suppress(OSError):
            os.unlink(path)
        print(f"gpuidle: error: {err}", file=sys.stderr)
        return err.exit_code
    notes = monitor.notes()
    survivors = runner.survivors()
    if survivors:
        notes.append(f"{len(survivors)} process(es) of the command were still running at its exit: {survivors[:8]}")
    if result.killed:
        notes.append("gpuidle killed the command's process group")
    devices = sorted(use.devices) if use.seen_any and isinstance(host, PsutilHost) else None
    writer.close(MonitorEnd(t=monitor.clock.time(), samples=writer.samples, exit_code=result.exit_code,
                            devices=devices, notes=notes))
    print(f"gpuidle: the command exited with code {result.exit_code}; {writer.samples} samples in {path}",
          file=sys.stderr)
    report: UtilizationReport | None = None
    try:
        # stdout is the command's: piped to a file or a program, it must hold the command's output only
        report = _summarize_log(path, args, args.summary, to_stderr=True)
    except GpuidleError as err:
        warn(f"no summary: {err}")
    except Exception as err:  # the command's exit code matters more than the summary
        warn(f"no summary ({type(err).__name__}: {err})")
    if report is not None:
        _record(args, "run", report, [path], notes=shlex.join(cmd))
    return result.exit_code
