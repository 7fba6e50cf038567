"""Rules for device counters: utilization findings in, ranked recommendations out.

The counterpart of :mod:`gpuidle.advice.rules` for ``gpuidle run``/``monitor``/``summarize``.
Counters cannot see inside a step, so gains here are upper bounds from the idle time a
finding accounts for: each is a modelled range from nothing to that bound, its assumption named
(:func:`up_to`), and the confidence says so. ``step_s_saved`` needs the step rate
(``--steps-per-s``); without it it is 0 and the evidence says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuidle.advice import calc
from gpuidle.analysis.utilization import UtilAnalysis
from gpuidle.model import Cause, Gain, Recommendation, UtilFinding, UtilizationReport, UtilSeries, UtilSource

COMPUTE = "compute"
SPARE_MEMORY = "spare_memory"
"""The kind of the larger-batch advice: unused device memory is no idle cause (not launch overhead)."""


UP_TO_IDLE = ("device counters see no step: at most the idle this finding accounts for goes, none of it if that "
              "idle has another cause")
NOT_ESTIMABLE = "device counters cannot tell what this fix saves"


def up_to(step_s_saved: float, utilization_before: float, utilization_after: float, assumption: str) -> Gain:
    """A counter-based gain: from nothing to ``step_s_saved`` and ``utilization_after`` (the nominal is the
    bound), modelled."""
    return Gain(step_s_saved=step_s_saved, utilization_before=utilization_before, utilization_after=utilization_after,
                step_s_saved_low=0.0, step_s_saved_high=step_s_saved, basis="modelled", assumption=assumption)


@dataclass(frozen=True, slots=True)
class UtilRuleInput:
    analysis: UtilAnalysis
    steps_per_s: float | None

    @property
    def window_s(self) -> float:
        return self.analysis.window.dur_s

    @property
    def mean_util(self) -> float:
        devs = self.analysis.devices
        return sum(d.mean_util_pct for d in devs) / len(devs) / 100 if devs else 0.0

    def find(self, kind: str) -> list[UtilFinding]:
        return [f for f in self.analysis.findings if f.kind == kind]

    def gain(self, idle_removed_s: float) -> Gain:
        """Utilization once ``idle_removed_s`` of GPU idle is gone from the window (per average device)."""
        w = self.window_s
        after = calc.utilization_after(self.mean_util * w, w, min(idle_removed_s, w * (1 - self.mean_util))) \
            if w > 0 else self.mean_util
        steps = w * self.steps_per_s if self.steps_per_s else 0.0
        return up_to(idle_removed_s / steps if steps else 0.0, self.mean_util, after, UP_TO_IDLE)

    def rec(self, f: UtilFinding, *, id: str, cause: str, title: str, fix: str, confidence: str) -> Recommendation:
        """A recommendation from one finding: its evidence, and the gain of removing its idle time."""
        return Recommendation(id=id, cause=cause, title=title, evidence=self.evidence(f), fix=fix,
                              gain=self.gain(f.seconds), confidence=confidence)

    def evidence(self, f: UtilFinding) -> dict[str, object]:
        ev: dict[str, object] = {"finding": f.summary, **f.evidence}
        if f.device is not None:
            ev.setdefault("device", f.device)
        if not self.steps_per_s:
            ev["step_s_saved"] = "unknown: pass --steps-per-s for a per-step gain"
        return ev


UtilRule = Callable[[UtilRuleInput], list[Recommendation]]
EXPLAINED = ("input_bound", "waiting_comm_or_io", "periodic_drops")
"""Findings whose idle time a larger batch would not remove."""
LOW_UTIL = 0.8
"""Below this mean utilization, idle the counters cannot explain earns a pointer to the tools that can."""


def input_pipeline(x: UtilRuleInput) -> list[Recommendation]:
    return [x.rec(
        f, id="input_pipeline_cpu", cause=Cause.DATA_LOADING.value,
        title="GPUs wait while every CPU core is busy: make each sample cheaper to prepare",
        fix="# the cores are saturated, so more DataLoader workers will not help; cut CPU work per sample:\n"
            "#  - decode and augment on the GPU (torchvision.transforms.v2 on CUDA tensors, or NVIDIA DALI)\n"
            "#  - preprocess once, offline (resized, tokenized, packed shards), not at every epoch\n"
            "#  - keep workers from oversubscribing cores: torch.set_num_threads(1) in worker_init_fn\n"
            "loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=os.cpu_count() // gpus,\n"
            "                                     pin_memory=True, persistent_workers=True, prefetch_factor=4)",
        confidence="medium",
    ) for f in x.find("input_bound")]


def comm_or_io(x: UtilRuleInput) -> list[Recommendation]:
    out = []
    for f in x.find("waiting_comm_or_io"):
        if f.evidence.get("storage_io"):
            out.append(x.rec(
                f, id="storage_io", cause=Cause.DATA_LOADING.value,
                title="GPUs and CPU wait together while the disks read: the input is I/O bound",
                fix="# read ahead of the GPU: more workers hide latency when the CPU is idle\n"
                    "loader = torch.utils.data.DataLoader(dataset, ..., num_workers=16, prefetch_factor=8,\n"
                    "                                     persistent_workers=True, pin_memory=True)\n"
                    "# and stage the data on local NVMe (or page cache) instead of network storage;\n"
                    "# fewer, larger files (WebDataset/tar shards) read sequentially",
                confidence="medium",
            ))
            continue
        out.append(x.rec(
            f, id="profile_comm_or_io", cause=Cause.COMMUNICATION.value,
            title="GPUs and CPU idle together: the job waits on communication or I/O; profile a few steps",
            fix="# one profile tells communication from input: record 3 steps, then `gpuidle analyze run/traces/`\n"
                "with torch.profiler.profile(\n"
                "    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],\n"
                "    schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),\n"
                "    on_trace_ready=torch.profiler.tensorboard_trace_handler(\"run/traces\"),\n"
                ") as prof:\n"
                "    for batch in loader:\n"
                "        train_step(batch)\n"
                "        prof.step()\n"
                "# NCCL_DEBUG=INFO shows the transport (NVLink, IB, or slow sockets)",
            confidence="low",
        ))
    return out


def periodic_stall(x: UtilRuleInput) -> list[Recommendation]:
    out = []
    for f in x.find("periodic_drops"):
        period = f.evidence.get("period_s")
        out.append(x.rec(
            f, id="periodic_stall", cause=Cause.UNATTRIBUTED.value,
            title=f"Something stops the GPUs every {period} s: checkpointing, evaluation or logging?",
            fix="# match the period to what your loop does every N steps, then take it off the critical path:\n"
                "import torch.distributed.checkpoint as dcp\n"
                "future = dcp.async_save(model.state_dict(), checkpoint_id=f\"ckpt/step{step}\")  # saves in the "
                "background\n"
                "# evaluate less often or in a separate job; log from rank 0 only, and without .item() each step;\n"
                "# Python GC pauses: gc.freeze() after setup, or gc.disable() and gc.collect() every N steps",
            confidence="medium",
        ))
    return out


def imbalance(x: UtilRuleInput) -> list[Recommendation]:
    return [x.rec(
        f, id="device_imbalance", cause=Cause.STRAGGLER_WAIT.value,
        title=f"Device {f.evidence['lowest_device']} is busy less than device {f.evidence['highest_device']}: "
              f"uneven work, or a slower GPU",
        fix="# equal work per rank: DistributedSampler(dataset, drop_last=True), and batches of similar\n"
            "# length (bucket sequences by length); a slower GPU: nvidia-smi -q -d PERFORMANCE on that device\n"
            "# (clocks, throttle reasons); one process driving several GPUs: DistributedDataParallel,\n"
            "# not DataParallel",
        confidence="low",
    ) for f in x.find("imbalance")]


def larger_batch(x: UtilRuleInput) -> list[Recommendation]:
    out = []
    for f in x.find("memory_headroom"):
        k = int(f.evidence["batch_factor"])
        u = x.mean_util
        if u >= 0.9 or u <= 0:
            continue
        # a k-times batch does the same work in k-times fewer steps: per-step overhead (launches, host
        # work, syncs) shrinks k-fold; idle the counters already explain (input, stalls, waiting) does not.
        busy = u * x.window_s
        idle = x.window_s - busy
        explained = min(idle, sum(g.seconds for g in x.analysis.findings if g.kind in EXPLAINED))
        fixed = idle - explained
        saved = fixed * (1 - 1 / k)
        after = busy / (busy + explained + fixed / k) if busy + explained + fixed > 0 else u
        steps = x.window_s * x.steps_per_s if x.steps_per_s else 0.0
        example_lr = calc.scaled_lr(1e-3, 1, k)
        ev = x.evidence(f)
        ev["assumption"] = (f"idle not explained by other findings ({fixed:.1f} s) is per-step overhead and "
                            f"shrinks {k}x; the rest stays")
        out.append(Recommendation(
            id="larger_batch_memory", cause=SPARE_MEMORY,
            title=f"{f.share * 100:.0f} % of device memory is unused: try a {k}x larger batch",
            evidence=ev,
            fix=f"batch_size = {k} * batch_size\n"
                f"lr = base_lr * {k}   # linear scaling rule (SGD; e.g. 1e-3 -> {example_lr:g}), with a few epochs of"
                f" warmup;\n"
                f"                     # sqrt({k}) for Adam-type optimizers\n"
                f"# or keep the effective batch and the lr: per-GPU batch x{k}, gradient accumulation steps /{k}",
            gain=up_to(saved / steps if steps else 0.0, u, after, str(ev["assumption"])), confidence="low",
        ))
    return out


def throttling(x: UtilRuleInput) -> list[Recommendation]:
    found = x.find("throttling")
    if not found:
        return []
    devices = [f.device for f in found]
    reasons = sorted({r for f in found for r in f.evidence["reasons"]})
    which = f"device {devices[0]}" if len(devices) == 1 else f"devices {', '.join(map(str, devices))}"
    ev: dict[str, object] = {"findings": [f.summary for f in found], "devices": devices, "reasons": reasons}
    return [Recommendation(
        id="clock_throttling", cause=COMPUTE,
        title=f"Clocks slowed on {which}: {', '.join(reasons)}",
        evidence=ev,
        fix="nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE -i <device>   # which limit, how often\n"
            "# thermal: airflow, fan curves, neighbours; power cap: the board limit (nvidia-smi -pl, as admin);\n"
            "# a GPU much hotter than its peers in the same node needs servicing",
        gain=up_to(0.0, x.mean_util, x.mean_util, NOT_ESTIMABLE), confidence="low",
    )]


def cpu_limits(x: UtilRuleInput) -> list[Recommendation]:
    """The CPU the job runs on is held back; where the GPUs also wait for data, that data loading is what it slows."""
    out = []
    for f in x.find("cpu_throttled"):
        data = f.cause == Cause.DATA_LOADING.value
        quota = f.evidence.get("quota_cpus")
        out.append(x.rec(
            f, id="cpu_throttled", cause=Cause.DATA_LOADING.value if data else COMPUTE,
            title=("The GPUs wait for data loading on a CPU that is held back: give the job more CPU"
                   if data else "The job's CPU is held back: the host's launches and data loading run slower"),
            fix=(f"# the cgroup allows {quota:g} CPUs: raise the limit (Kubernetes: resources.limits.cpu;\n"
                 f"# Slurm: --cpus-per-task; Docker: --cpus), or run fewer loader workers than it allows\n"
                 if isinstance(quota, float) else "")
                + "cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu.stat   # cgroup v2 (v1: cpu/cpu.cfs_quota_us)\n"
                  "# slow clocks: the performance governor (cpupower frequency-set -g performance);\n"
                  "# steal time: a VM sharing its cores, ask for dedicated vCPUs",
            confidence="medium" if data else "low",
        ))
    return out


def fill_the_sms(x: UtilRuleInput) -> list[Recommendation]:
    return [Recommendation(
        id="fill_the_sms", cause=Cause.LAUNCH_OVERHEAD.value,
        title=f"Device {f.device} is 'busy' but its SMs are mostly idle: kernels too small to fill the GPU",
        evidence=x.evidence(f),
        fix="model = torch.compile(model)            # fuses small kernels\n"
            "# larger per-GPU batch (see memory headroom); check kernel sizes: gpuidle analyze on a profiler trace",
        gain=up_to(0.0, x.mean_util, x.mean_util, NOT_ESTIMABLE), confidence="low",
    ) for f in x.find("sm_underused")]


def explain_low_utilization(x: UtilRuleInput) -> list[Recommendation]:
    """Low utilization with no counter that says why: point at the tools that can."""
    specific = {"input_bound", "waiting_comm_or_io", "periodic_drops"}
    if any(f.kind in specific for f in x.analysis.findings) or x.mean_util >= LOW_UTIL:
        return []
    return [Recommendation(
        id="find_the_cause", cause=Cause.UNATTRIBUTED.value,
        title="Utilization is low and the counters alone do not say why: attribute the idle time",
        evidence=x.evidence(f),
        fix="gpuidle run -- python train.py ...     # GPU and CPU together: input-bound or waiting?\n"
            "# then a profiler trace: every idle ms gets a cause\n"
            "gpuidle analyze run/traces/",
        gain=up_to(0.0, x.mean_util, x.mean_util, NOT_ESTIMABLE), confidence="low",
    ) for f in x.find("low_utilization")]


RULES: list[UtilRule] = [input_pipeline, comm_or_io, periodic_stall, imbalance, larger_batch, throttling,
                         cpu_limits, fill_the_sms, explain_low_utilization]


def recommend(analysis: UtilAnalysis, steps_per_s: float | None = None,
              rules: list[UtilRule] = RULES) -> list[Recommendation]:
    """Every recommendation the counters support, largest expected gain first."""
    x = UtilRuleInput(analysis, steps_per_s)
    return rank_util([r for rule in rules for r in rule(x)])


def rank_util(recs: list[Recommendation]) -> list[Recommendation]:
    """Largest utilization after first (the same order as time saved, which needs the step rate), then confidence."""
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(recs, key=lambda r: (-(r.gain.utilization_after or 0.0), order.get(r.confidence, 3), r.id))


def build_report(series: UtilSeries, analysis: UtilAnalysis, steps_per_s: float | None = None) -> UtilizationReport:
    """The serialisable summary: analysis, recommendations and where the samples came from."""
    return UtilizationReport(
        source=UtilSource(paths=series.paths, format=series.format, command=series.command,
                          exit_code=series.exit_code),
        window=analysis.window, devices=analysis.devices, host=analysis.host,
        gpu_unavailable=series.gpu_unavailable, findings=analysis.findings,
        recommendations=recommend(analysis, steps_per_s), notes=analysis.notes,
    )
