"""Rules on the host's side of a step: a larger batch where the step's fixed costs outweigh its compute, and host
work that launches nothing, said by what the trace shows it is (the model's own forward or operators, a compiled
model's wrapper, work around the model)."""

from __future__ import annotations

import re

from gpuidle.advice.frameworks import engine_batch, graph_fix
from gpuidle.advice.preconditions import NO_READBACK
from gpuidle.advice.ruleinput import RuleInput, _ms, removes, removes_between
from gpuidle.advice.whatif import Proposal
from gpuidle.analysis.steps import counted
from gpuidle.model import Cause

COMPUTE_LIGHT = 0.2
"""A step whose GPU computes under this share of it is compute-light: its fixed costs per step (launches, host
work, syncs) outweigh its compute, and a larger batch spreads them over more samples before any other fix."""


BATCH = (0.25, 0.5)
"""A larger batch's share of the launch and host idle it removes per sample where kernels are short."""
BATCH_LIGHT = (0.4, 0.5)
"""The same where the step is compute-light: its fixed costs per step halve per sample with twice the batch; host
work that grows with the batch leaves less."""


def larger_batch(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    fixed = (Cause.LAUNCH_OVERHEAD, Cause.CPU_COMPUTE, Cause.HOST_SYNC)
    starved = x.share(Cause.LAUNCH_OVERHEAD) + x.share(Cause.CPU_COMPUTE)
    busy = x.state.busy_s / x.state.step_s if x.state.step_s else 1.0
    light = busy < COMPUTE_LIGHT and sum(x.share(c) for c in fixed) >= 0.2
    if not light and (k.short_kernel_share < 0.5 or starved < 0.2):
        return []
    engine = engine_batch(x.report.workload)
    if engine is not None:
        title, fix = engine
    elif x.inference:
        title = "Tiny kernels starve the GPU: serve more requests per forward pass (a larger batch)"
        fix = ("# batch requests together: twice the rows per forward pass, the same launches\n"
               "outputs = model(torch.cat(requests))      # or raise the server's max batch size")
    else:
        title = "Tiny kernels starve the GPU: double the per-GPU batch (scale the learning rate with it)"
        fix = ("batch_size = 2 * batch_size\n"
               "lr = base_lr * batch_size / base_batch_size      "
               "# linear scaling rule (SGD); sqrt scaling for Adam-type\n"
               "# out of memory? keep the per-GPU batch and accumulate k micro-batches per optimizer step\n"
               "# (under model.no_sync() for all but the last one with DDP)")
    if light and engine is None:
        title = title.replace("Tiny kernels starve the GPU", f"The GPU computes {busy:.0%} of the step")
    claimed = fixed if light else fixed[:2]
    return [x.rec(
        "larger_batch", Cause.LAUNCH_OVERHEAD, title,
        {"short_kernel_share": round(k.short_kernel_share, 3), "launch_plus_cpu_share": round(starved, 3),
         "compute_share_of_step": round(busy, 3),
         "assumption": (f"the GPU computes {busy:.0%} of the step: 2x batch halves the step's fixed costs per sample "
                        "(launches, syncs, host work), 40-50 % of their idle (host work that grows with the batch "
                        "leaves less)") if light else
                       "2x batch: host time per sample falls by a quarter to a half, and so does this idle"},
        fix, removes_between(*(BATCH_LIGHT if light else BATCH), {c: x.idle(c) for c in claimed}),
        confidence="medium" if light else "low",
    )]


MODEL_CODE = re.compile(r"forward\b|/models?/|/layers?/|moe|expert|attention|/modeling_", re.IGNORECASE)
"""Python frames of a model's own forward pass (its modules, layers, attention, MoE routing), not pre- or
post-processing around it."""
MODEL_CODE_SHARE = 0.5


def cpu_work(x: RuleInput) -> list[Proposal]:
    if x.share(Cause.CPU_COMPUTE) < 0.10:
        return []
    evidence: dict[str, object] = {"cpu_compute_ms_per_step": _ms(x.idle(Cause.CPU_COMPUTE))}
    hotspots = x.report.python_hotspots
    if hotspots:
        evidence["python_at_idle_ms"] = {h.function[:120]: _ms(x.per_window_step(h.idle_s)) for h in hotspots}
    locate = ("# where: the Python functions in the evidence (from the trace's stacks)" if x.python_stacks else
              "# locate it: torch.profiler.profile(..., with_stack=True) and sort by self CPU time")
    fix, compiled = _host_work_fix(x, evidence)
    if not compiled:  # work moved off the step's path: all of its idle goes
        return [x.rec("move_cpu_work", Cause.CPU_COMPUTE, "Host-side work that launches nothing holds the GPU back",
                      evidence, fix + locate, removes(Cause.CPU_COMPUTE, x.idle(Cause.CPU_COMPUTE)))]
    evidence["assumption"] = COMPILE_ASSUMPTION
    return [x.rec("move_cpu_work", Cause.CPU_COMPUTE, "Host-side work that launches nothing holds the GPU back",
                  evidence, fix + locate,
                  removes_between(COMPILE_LOW, COMPILE_HIGH, {Cause.CPU_COMPUTE: x.idle(Cause.CPU_COMPUTE)}),
                  confidence="medium")]


COMPILE_LOW, COMPILE_HIGH = 0.5, 1.0
COMPILE_ASSUMPTION = ("compiling the model's forward (or replaying it as a graph) removes 50–100 % of the host time "
                      "between its launches (graph breaks and Python outside the compiled region stay)")
"""Host time inside the model's own forward is not moved but compiled away, and how much goes is the compiler's."""


def _host_work_fix(x: RuleInput, evidence: dict[str, object]) -> tuple[str, bool]:
    """What to do about host work between launches, by what the trace says it is: the model's own forward pass
    (its Python, or its operators' own host time: replay it as a graph, or compile it where the step reads values
    back; there is nothing to move), a compiled model's wrapper, or work around the model; and whether the fix
    compiles the work away (a modelled saving) rather than moving it off the step's path (all of it)."""
    workload = x.report.workload
    hotspots = x.report.python_hotspots
    in_model = sum(h.idle_s for h in hotspots if MODEL_CODE.search(h.function))
    operators = sorted({c.name for s in counted(x.report.steps, x.include_all)
                        for cause, c in s.main_calls.items() if cause == Cause.CPU_COMPUTE.value
                        and c.name.startswith("aten::")})
    if hotspots and in_model >= MODEL_CODE_SHARE * sum(h.idle_s for h in hotspots):
        evidence["python_in_model_forward_share"] = round(in_model / sum(h.idle_s for h in hotspots), 3)
        said = "# the Python under the idle is the model's own forward: "
    elif operators:
        evidence["model_operators_at_idle"] = operators
        said = f"# the host time is inside the model's own operators ({', '.join(operators[:3])}): "
    else:
        said = ""
    graphs = graph_fix(workload)
    if said and graphs is not None and NO_READBACK.holds(x):
        return said + "replay it as a CUDA graph\n" + graphs[1] + "\n", True
    if said and (workload is None or workload.engine is None):
        return (said + "compile it (its .item() reads rule out a CUDA graph: remove them first)\n"
                "model = torch.compile(model)   # fuses the operators, fewer launches and less dispatch\n"), True
    if workload is not None and workload.execution == "compiled" and workload.engine is None:
        return ("# the model is compiled: the host time left is its wrapper's Python between launches (guards,\n"
                "# size checks); replaying CUDA graphs skips it\n"
                "model = torch.compile(model, mode=\"reduce-overhead\")\n"), True
    where = ("# move pre- and post-processing off the serving thread (a worker pool), batch it on the GPU\n"
             if x.inference else
             "# move per-sample preprocessing into Dataset.__getitem__ (runs in DataLoader workers)\n")
    eager = workload is None or (workload.engine is None and workload.execution == "eager")
    return where + ("# and fuse Python-level tensor code: model = torch.compile(model)\n" if eager else ""), False
