"""``gpuidle analyze --scale-to N``: the options of the scale-out what-if, and the report with it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuidle.cli.common import positive_float, positive_int

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport


def add_options(an: argparse.ArgumentParser) -> None:
    g = an.add_argument_group("scale-out", "the job at more GPUs: step, utilization and samples/s, each a range")
    g.add_argument("--scale-to", type=positive_int, metavar="N",
                   help="predict the job at N GPUs (N at least the job's own)")
    g.add_argument("--scale-dim", choices=["dp", "tp", "pp"], default="dp",
                   help="the dimension that grows (default dp, data parallel; the only one modelled)")
    g.add_argument("--strong-scaling", action="store_true",
                   help="keep the global batch (each GPU gets a share of it); default: keep the per-GPU batch")
    g.add_argument("--gpus-per-node", type=positive_int, default=8,
                   help="GPUs per node: past it the ring crosses the network, and more loaders share no host "
                        "(default 8)")
    g.add_argument("--allreduce-results", metavar="JSON",
                   help="gpuidle bench allreduce --json output: its all-reduce gives the latency and bandwidth "
                        "(default: fitted on the trace's own collectives)")
    g.add_argument("--inter-node-gbps", type=positive_float, metavar="GBPS",
                   help="bus bandwidth between nodes, GB/s (default: from the fitted one to an eighth of it)")
    g.add_argument("--params", type=positive_int, metavar="N",
                   help="the model's parameter count: the gradient size where the trace has no collective")


def with_scale_out(args: argparse.Namespace, report: AnalysisReport) -> AnalysisReport:
    if args.scale_to is None:
        return report
    from gpuidle import api

    return api.with_scale_out(report, args.scale_to, dim=args.scale_dim, strong=args.strong_scaling,
                              gpus_per_node=args.gpus_per_node, params=args.params,
                              allreduce_results=args.allreduce_results, inter_node_gbps=args.inter_node_gbps,
                              batch_size=args.batch_size)
