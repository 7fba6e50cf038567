"""``gpuidle bench``, ``gpuidle tune`` and ``gpuidle cost``: measure what rules of thumb guess.

``bench allreduce`` and ``bench net`` run on every rank under torchrun
(``torchrun ... -m gpuidle bench allreduce``) and print on rank 0; standalone they
spawn ``--nproc`` local ranks. Every bench and tune result is recorded in the ledger
(kind ``bench``), by rank 0 only under a launcher; ``cost`` computes, it measures nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec

from gpuidle.advice import calc
from gpuidle.cli.common import (
    Parser,
    add_ledger_option,
    emit,
    finite_float,
    fraction,
    positive_float,
    positive_int,
    record_run,
    refuse_overwriting_inputs,
    render_options,
    warn,
)
from gpuidle.errors import GpuidleError
from gpuidle.ledger import Facts
from gpuidle.model import CalcLine

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def byte_size(text: str) -> int:
    """``8``, ``64K``, ``16M``, ``1G`` (powers of 1024, as nccl-tests reads them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 8, 64K, 16M, 1G)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give worker counts of 0 or more, e.g. 0,2,4")
    return values


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the JSON result")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout (JSON if FILE ends in .json)")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.add_argument("--label", help="name this result in the ledger, e.g. 'after the NCCL upgrade'")
    add_ledger_option(p)


def _ranks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="local ranks to spawn when not under torchrun (default: the GPUs, or 2 on the CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: nccl; cpu: gloo (default: cuda when available)")
    p.add_argument("--timeout-s", type=positive_float, default=300.0,
                   help="give up when a rank does not answer for this long (default 300)")


def register(sub: argparse._SubParsersAction[Parser]) -> None:
    bench = sub.add_parser("bench", help="measure collectives, links and storage",
                           description="Measure what the guide's rules of thumb only guess.")
    bsub = bench.add_subparsers(dest="probe", required=True, parser_class=Parser)

    ar = bsub.add_parser("allreduce", help="collective bandwidth, like nccl-tests",
                         description="Time all_reduce, all_gather, reduce_scatter, broadcast and all_to_all "
                                     "over torch.distributed for message sizes ×2 from --min-bytes to --max-bytes.")
    _ranks(ar)
    ar.add_argument("--ops", default=",".join(_ops()), help="comma-separated operations (default: all five)")
    ar.add_argument("--min-bytes", type=byte_size, default=8, help="smallest message (default 8)")
    ar.add_argument("--max-bytes", type=byte_size, default=None,
                    help="largest message (default 1G on a GPU, 64M on the CPU; bounded by memory)")
    ar.add_argument("--warmup", type=positive_int, default=5, help="warm-up iterations per size (default 5)")
    ar.add_argument("--iters", type=positive_int, default=20, help="timed iterations per run (default 20)")
    ar.add_argument("--runs", type=positive_int, default=5,
                    help="timed runs per size, the median shown; as many again when they disagree (default 5)")
    ar.add_argument("--max-s-per-size", type=positive_float, default=2.0,
                    help="fewer timed iterations where a size would take longer (default 2)")
    ar.add_argument("--dtype", default="float32", help="element type (default float32)")
    ar.add_argument("--compare", metavar="REPORT",
                    help="a gpuidle analyze --json report: set its collectives' busbw beside these")
    _output(ar)
    ar.set_defaults(func=run_allreduce)

    net = bsub.add_parser("net", help="point-to-point latency and bandwidth of every link",
                          description="Ping-pong through torch.distributed send/recv between every pair of nodes "
                                      "(every pair of ranks on one node) and name the slow link.")
    _ranks(net)
    net.add_argument("--bytes", type=byte_size, default=None, help="message for bandwidth (default 64M GPU, 16M CPU)")
    net.add_argument("--iters", type=positive_int, default=20, help="round trips per run (default 20)")
    net.add_argument("--runs", type=positive_int, default=5,
                     help="runs per measurement, the median shown; as many again when they disagree (default 5)")
    net.add_argument("--level", choices=("auto", "node", "rank"), default="auto",
                     help="pair nodes or ranks (default: nodes when there are several)")
    _output(net)
    net.set_defaults(func=run_net)

    st = bsub.add_parser("storage", help="read throughput and files/s of a dataset folder",
                         description="Sequential, random and whole-file reads over PATH for a bounded time; "
                                     "says when the page cache flattered the figures.")
    st.add_argument("path", metavar="PATH", help="the dataset folder (or one file)")
    st.add_argument("--budget-s", type=positive_float, default=20.0, help="seconds to spend (default 20)")
    st.add_argument("--block", type=byte_size, default=64 << 10, help="random read size (default 64K)")
    st.add_argument("--drop-cache", action="store_true",
                    help="evict each file from the page cache before reading it (posix_fadvise DONTNEED)")
    st.add_argument("--max-files", type=positive_int, default=200_000, help="stop listing after this many files")
    _output(st)
    st.set_defaults(func=run_storage)

    tune = sub.add_parser("tune", help="find the settings that keep the GPU fed",
                          description="Sweep settings on your own code and recommend the smallest that suffices.")
    tsub = tune.add_subparsers(dest="tuner", required=True, parser_class=Parser)
    lo = tsub.add_parser("loader", help="sweep DataLoader num_workers, pin_memory, prefetch_factor, persistent_workers",
                         description="Import your Dataset factory, measure steady-state batches/s for each setting "
                                     "(worker start-up reported apart) and recommend the smallest that reaches "
                                     "the rate the GPU consumes.")
    lo.add_argument("--dataset", required=True, metavar="MODULE:FUNCTION",
                    help="a function returning your Dataset (imported with the current folder on the path)")
    lo.add_argument("--collate", metavar="MODULE:FUNCTION", help="your collate_fn")
    lo.add_argument("--sampler", metavar="MODULE:FUNCTION", help="a function taking the dataset, returning a Sampler")
    lo.add_argument("--batch-size", type=positive_int, required=True)
    lo.add_argument("--budget-s", type=positive_float, default=60.0, help="seconds for the whole sweep (default 60)")
    target = lo.add_mutually_exclusive_group()
    target.add_argument("--target-batches-per-s", type=positive_float, help="the rate the GPU consumes")
    target.add_argument("--target-from", metavar="REPORT",
                        help="a gpuidle analyze --json report: target = 1 / median compute time per step")
    lo.add_argument("--workers", type=_int_list, help="worker counts to try, e.g. 0,2,4,8 (default 0,1,2,4,… cores)")
    lo.add_argument("--local-ranks", type=positive_int, default=None,
                    help="training processes per node sharing the cores (default: LOCAL_WORLD_SIZE, or 1)")
    lo.add_argument("--no-variants", action="store_true",
                    help="sweep num_workers only (skip prefetch_factor, pin_memory, persistent_workers)")
    _output(lo)
    lo.set_defaults(func=run_tune_loader)

    co = sub.add_parser("cost", help="GPU-hours and money lost to idle time; LR, accumulation, busbw formulas",
                        description="The standard formulas, each shown with its formula and rounding.")
    co.add_argument("--gpus", type=positive_int, help="GPUs in the job")
    co.add_argument("--hours", type=positive_float, help="hours the job runs")
    co.add_argument("--utilization", type=fraction, help="measured utilization, 0..1")
    co.add_argument("--price-per-gpu-hour", type=finite_float, help="price of one GPU-hour, any currency")
    co.add_argument("--target", type=fraction, default=None, help="target utilization, 0..1 (e.g. 0.9)")
    co.add_argument("--from", dest="from_report", metavar="REPORT",
                    help="a gpuidle analyze --json report: GPUs and utilization from it")
    co.add_argument("--lr", type=positive_float, help="learning rate at --batch (with --new-batch)")
    co.add_argument("--batch", type=positive_int, help="current global batch size")
    co.add_argument("--new-batch", type=positive_int, help="new global batch size")
    co.add_argument("--effective-batch", type=positive_int, help="global batch wanted (with --micro-batch)")
    co.add_argument("--micro-batch", type=positive_int, help="per-GPU batch that fits in memory")
    co.add_argument("--world-size", type=positive_int, default=None, help="data-parallel ranks (default --gpus or 1)")
    co.add_argument("--algbw", type=finite_float, help="algorithm bandwidth in GB/s (with --collective, --ranks)")
    co.add_argument("--collective", default="all_reduce", help="collective for --algbw (default all_reduce)")
    co.add_argument("--ranks", type=positive_int, help="ranks in the collective for --algbw")
    co.add_argument("--json", action="store_true", help="print the JSON result")
    co.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    co.set_defaults(func=run_cost)


def _ops() -> tuple[str, ...]:
    return ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def _print(result: msgspec.Struct, args: argparse.Namespace) -> int:
    from gpuidle.report.bench import render

    to_file_json = bool(args.out and args.out.endswith(".json"))
    fmt = "json" if args.json or to_file_json else "terminal"
    emit(render(result, render_options(args, args.out is None and sys.stdout.isatty()), fmt), args.out)
    return 0


def _rank() -> int:
    """This process's rank under a launcher (``RANK``), else 0."""
    try:
        return int(os.environ.get("RANK") or 0)
    except ValueError:
        return 0


def _bench_facts(result: msgspec.Struct) -> Facts:
    """GPU model and count of a result measured on GPUs, the batch size of a loader sweep."""
    facts = Facts()
    if getattr(result, "device", None) == "cuda":
        facts["gpu_model"] = getattr(result, "device_name", None)
        facts["gpu_count"] = getattr(result, "world_size", None)
    batch = getattr(result, "batch_size", None)
    if isinstance(batch, int):
        facts["batch_size"] = batch
    return facts


def _record(args: argparse.Namespace, result: msgspec.Struct, inputs: Sequence[str | None] = (),
            notes: str | None = None) -> None:
    """Keep the result in the ledger (kind ``bench``); under a launcher, rank 0 alone records it."""
    if _rank() != 0:
        return
    facts = _bench_facts(result)
    facts["notes"] = notes
    record_run(args, "bench", msgspec.json.encode(result), args.label, [f for f in inputs if f], **facts)


@contextmanager
def _progress(args: argparse.Namespace, label: str) -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress bar on stderr, on a terminal only."""
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(label + " {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("", total=None)

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        yield update


def _launched(args: argparse.Namespace) -> bool:
    from gpuidle.probes.ranks import under_launcher

    if under_launcher():
        if args.nproc is not None:
            warn("running under a launcher: --nproc is ignored, the launcher's ranks are used")
        return True
    return False


def run_allreduce(args: argparse.Namespace) -> int:
    from gpuidle.api import read_analysis_report
    from gpuidle.probes import allreduce as ar

    refuse_overwriting_inputs([args.compare], {"--out": args.out})
    report = read_analysis_report(args.compare) if args.compare else None
    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    cfg = ar.AllReduceConfig(ops=ops, min_bytes=args.min_bytes, max_bytes=args.max_bytes, warmup=args.warmup,
                             iters=args.iters, runs=args.runs, max_s_per_size=args.max_s_per_size,
                             dtype=args.dtype)
    launched = _launched(args)
    with _progress(args, "bench allreduce") as progress:
        result = ar.run_allreduce(cfg, nproc=None if launched else args.nproc, device=args.device,
                                  timeout_s=args.timeout_s, progress=progress)
    if result is None:  # a rank other than 0 under torchrun: rank 0 prints
        return 0
    if report is not None:
        from gpuidle.probes.training import with_comparison

        result = with_comparison(result, report)
    _print(result, args)
    _record(args, result, [args.compare])
    return 0


def run_net(args: argparse.Namespace) -> int:
    from gpuidle.probes import net

    cfg = net.NetConfig(bytes=args.bytes, iters=args.iters, runs=args.runs, level=args.level)
    launched = _launched(args)
    with _progress(args, "bench net") as progress:
        result = net.run_net(cfg, nproc=None if launched else args.nproc, device=args.device,
                             timeout_s=args.timeout_s, progress=progress)
    if result is None:  # a rank other than 0 under torchrun: rank 0 prints
        return 0
    _print(result, args)
    _record(args, result)
    return 0


def run_storage(args: argparse.Namespace) -> int:
    from gpuidle.probes.storage import bench_storage

    with _progress(args, "bench storage") as progress:
        result = bench_storage(args.path, budget_s=args.budget_s, block_bytes=args.block, drop_cache=args.drop_cache,
                               max_files=args.max_files, progress=progress)
    _print(result, args)
    _record(args, result, notes=f"bench storage {result.path}")  # the dataset itself is not hashed: too big
    return 0


def run_tune_loader(args: argparse.Namespace) -> int:
    from gpuidle.api import read_analysis_report
    from gpuidle.probes import loader

    refuse_overwriting_inputs([args.target_from], {"--out": args.out})
    target, source = args.target_batches_per_s, "given" if args.target_batches_per_s else None
    if args.target_from:
        target = loader.target_from_report(read_analysis_report(args.target_from))
        source = f"1 / median compute time per step in {args.target_from}"
    dataset = loader.make_dataset(args.dataset)
    collate = loader.load_object(args.collate, "collate_fn") if args.collate else None
    sampler: Any = None
    if args.sampler:
        make_sampler = loader.load_object(args.sampler, "sampler")
        try:
            sampler = make_sampler(dataset)
        except Exception as err:
            raise GpuidleError(f"the sampler factory {args.sampler} raised {type(err).__name__}: {err}") from None
    local = args.local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    with _progress(args, "tune loader") as progress:
        result = loader.tune_loader(dataset, batch_size=args.batch_size, budget_s=args.budget_s,
                                    target_batches_per_s=target, target_source=source, workers=args.workers,
                                    local_ranks=local, variants=not args.no_variants, collate_fn=collate,
                                    sampler=sampler, dataset_name=args.dataset, progress=progress)
    _print(result, args)
    _record(args, result, [args.target_from], notes=f"tune loader {args.dataset}")
    return 0


def _formulas(args: argparse.Namespace) -> bool:
    """Whether other formulas were asked for: then ``--gpus`` alone is their world size, not a cost."""
    return any(v is not None for v in (args.lr, args.new_batch, args.effective_batch, args.micro_batch, args.algbw))


def run_cost(args: argparse.Namespace) -> int:
    cost = None
    if args.from_report:
        from gpuidle.api import read_analysis_report

        if args.hours is None:
            raise GpuidleError("--from needs --hours: a trace covers seconds, the cost is per job")
        if args.utilization is not None:
            raise GpuidleError("give --from or --utilization, not both")
        report = read_analysis_report(args.from_report)
        cost = calc.cost_from_report(report, args.price_per_gpu_hour, args.hours,
                                     args.target if args.target is not None else calc.TARGET_UTILIZATION, args.gpus)
    elif args.hours is not None or args.utilization is not None or (args.gpus is not None and not _formulas(args)):
        missing = [f"--{n}" for n, v in (("gpus", args.gpus), ("hours", args.hours),
                                          ("utilization", args.utilization)) if v is None]
        if missing:
            raise GpuidleError(f"the cost needs {', '.join(missing)}", "or --from report.json with --hours")
        cost = calc.cost(args.gpus, args.hours, args.utilization, args.price_per_gpu_hour, args.target)
    lines: list[CalcLine] = []
    if any(v is not None for v in (args.lr, args.new_batch)):
        if args.lr is None or args.batch is None or args.new_batch is None:
            raise GpuidleError("learning-rate scaling needs --lr, --batch and --new-batch")
        lines += calc.lr_lines(args.lr, args.batch, args.new_batch)
    if args.effective_batch is not None or args.micro_batch is not None:
        if args.effective_batch is None or args.micro_batch is None:
            raise GpuidleError("accumulation steps need --effective-batch and --micro-batch")
        lines.append(calc.accumulation_line(args.effective_batch, args.micro_batch, args.world_size or args.gpus or 1))
    if args.algbw is not None:
        if args.ranks is None:
            raise GpuidleError("busbw needs --ranks (the ranks in the collective)")
        lines.append(calc.busbw_line(args.collective, args.ranks, args.algbw))
    if cost is None and not lines:
        raise GpuidleError("nothing to compute", "e.g. gpuidle cost --gpus 64 --hours 72 --utilization 0.55 "
                                                 "--price-per-gpu-hour 2.5 --target 0.9")
    out = calc.CalcReport(cost=cost, lines=lines)
    return _print(out, args)
