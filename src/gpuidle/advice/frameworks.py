"""Fixes in the profiled framework's own words: TensorFlow, JAX and Keras-on-JAX texts for the rules' ids.

The rules (``advice.rules``) measure and write their fix against PyTorch. For a profile that
says it came from TensorFlow or JAX (``Source.framework``), each recommendation keeps its
id, evidence and effect and takes the title and fix below; a rule with no counterpart in
that framework (``None``) is left out rather than shown in another framework's API. Every
API named here is checked against the installed package in ``tests/test_frameworks.py``.
"""

from __future__ import annotations

import msgspec

from gpuidle.advice.whatif import Proposal
from gpuidle.model import Workload

UNEXPLAINED_BY_TRACKER = "The step tracker cannot explain most of the idle time: record a profile with host activity"
"""``record_cpu_activity``'s title for a tracker run, whatever the framework: its steps hold no profile to blame."""


class Wording(msgspec.Struct, frozen=True):
    title: str
    fix: str
    """``{dtype}`` is replaced by the mixed-precision dtype the device supports (``bfloat16``/``float16``)."""


_NCCL = (
    "# which transport does NCCL pick? (debug output: not for production runs)\n"
    "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET python train.py   # look for 'via NET/Socket' vs 'NET/IB'\n"
    "export NCCL_SOCKET_IFNAME=ib0        # or your high-speed Ethernet interface, e.g. ens5\n"
    "export NCCL_IB_DISABLE=0"
)
_BATCH = (
    "batch_size = 2 * batch_size\n"
    "learning_rate = base_learning_rate * 2   # linear scaling rule (SGD); sqrt scaling for Adam-type\n"
)

PYTORCH_LIBRARIES = (
    "embedding_all_to_all", "fsdp_prefetch", "fsdp_forward_prefetch", "fsdp_backward_prefetch",
    "fsdp_reshard_after_forward", "fsdp_reduce_dtype", "fsdp_hsdp", "fsdp_larger_units", "deepspeed_zero_stage",
    "deepspeed_stage3_prefetch", "deepspeed_overlap_comm", "deepspeed_reduce_bucket", "deepspeed_allgather_bucket",
    "pipeline_bubble", "tp_comm_overlap", "cp_comm_overlap", "recast_kernels",
)
"""Fixes in the settings of PyTorch's own libraries (TorchRec, FSDP2, DeepSpeed, ``torch.distributed.pipelining``,
Megatron-Core) and of its autocast's casts: not in this stack for TensorFlow, JAX, Keras or a CUDA program, each
said so explicitly."""

TENSORFLOW: dict[str, Wording | None] = {
    **dict.fromkeys(PYTORCH_LIBRARIES),
    "dataloader_workers": Wording(
        "Feed the GPU from a parallel tf.data pipeline: interleave, parallel map, cache, prefetch",
        "dataset = (\n"
        "    tf.data.Dataset.list_files(pattern)\n"
        "    .interleave(tf.data.TFRecordDataset, cycle_length=8,         # read files in parallel\n"
        "                num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)\n"
        "    .map(parse, num_parallel_calls=tf.data.AUTOTUNE)             # decode on every core\n"
        "    .cache()                      # after the expensive steps, if the data fits in memory\n"
        "    .shuffle(10_000)\n"
        "    .batch(batch_size)\n"
        "    .prefetch(tf.data.AUTOTUNE)   # the next batches are ready while the GPU trains\n"
        ")"),
    "remove_host_sync": Wording(
        "Stop reading values back every step (.numpy(), float(loss), print of tensors)",
        "loss_metric = tf.keras.metrics.Mean()\n"
        "loss_metric.update_state(loss)            # stays on the device\n"
        "if step % 100 == 0:\n"
        "    print(float(loss_metric.result())); loss_metric.reset_state()\n"
        "# with Keras: model.compile(..., steps_per_execution=32) runs 32 steps per host round trip"),
    "pinned_memory_non_blocking": Wording(
        "Copy batches to the GPU ahead of the step: prefetch to the device",
        "dataset = dataset.apply(tf.data.experimental.prefetch_to_device(\"/gpu:0\"))   # the last transformation\n"
        "# under a tf.distribute strategy: dist = strategy.experimental_distribute_dataset(dataset)"),
    "cuda_graphs": Wording(
        "Launch-bound: compile the step with XLA (jit_compile=True) and run several steps per call",
        "@tf.function(jit_compile=True)      # fuses the step's ops into few kernels\n"
        "def train_step(x, y): ...\n"
        "# Keras: model.compile(optimizer, loss, jit_compile=True, steps_per_execution=32)"),
    "larger_batch": Wording(
        "Tiny kernels starve the GPU: double the per-GPU batch (scale the learning rate with it)",
        _BATCH + "dataset = dataset.batch(batch_size)"),
    "move_cpu_work": Wording(
        "Host-side work that launches nothing holds the GPU back",
        "# move Python preprocessing into the pipeline, where it runs in parallel ahead of the step\n"
        "dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)\n"
        "# and compile the step: @tf.function(jit_compile=True)"),
    "tf32": Wording(
        "Matrix multiplies and convolutions run in plain float32: allow TensorFloat-32 (one line)",
        "tf.config.experimental.enable_tensor_float_32_execution(True)   # on by default: was it turned off?"),
    "mixed_precision": Wording(
        "Matrix multiplies and convolutions run in float32: use Keras mixed precision",
        "tf.keras.mixed_precision.set_global_policy(\"mixed_{dtype}\")   # before building the model\n"
        "# custom training loop in float16: optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)"),
    "cudnn_benchmark": Wording(
        "Convolutions dominate: keep cuDNN autotuning on and compile the convolutions with XLA",
        "# TensorFlow autotunes cuDNN algorithms unless TF_CUDNN_USE_AUTOTUNE=0 is set: unset it\n"
        "@tf.function(jit_compile=True)\n"
        "def train_step(x, y): ..."),
    "ddp_no_sync": Wording(
        "Gradients are all-reduced on every micro-batch: accumulate them and reduce once per step",
        "optimizer = tf.keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=4)"),
    "ddp_bucket_cap": Wording(
        "Many small all-reduces per step: pack gradients into fewer, larger ones over NCCL",
        "strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce(num_packs=1))\n"
        "# several hosts: tf.distribute.MultiWorkerMirroredStrategy(\n"
        "#     communication_options=tf.distribute.experimental.CommunicationOptions(\n"
        "#         bytes_per_pack=50 * 1024 * 1024,\n"
        "#         implementation=tf.distribute.experimental.CommunicationImplementation.NCCL))"),
    "comm_compression": None,
    "zero_grad_set_to_none": None,
    "nccl_transport": Wording(
        "Large all-reduces reach little bus bandwidth: all-reduce over NCCL, on the fast network",
        "strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())\n" + _NCCL),
    "moe_all_to_all_overlap": Wording(
        "All-to-all (expert dispatch and combine) is exposed: overlap it with the experts' compute",
        "# let XLA schedule the dispatch/combine all-to-alls under independent compute\n"
        "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true python train.py\n"
        "# uneven experts make every device wait for the busiest: check the router's load-balancing loss"),
    "comm_bound_batch": Wording(
        "Communication takes as long as compute: more work per all-reduce",
        "# raise the per-GPU batch (scale the learning rate linearly), or accumulate gradients:\n"
        "optimizer = tf.keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=4)"),
    "record_cpu_activity": Wording(
        "The profile cannot explain most of the idle time: record host activity with it",
        "options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=1,\n"
        "                                                   device_tracer_level=1)\n"
        "tf.profiler.experimental.start(\"logs\", options=options)\n"
        "for step, (x, y) in enumerate(dataset.take(5)):\n"
        "    with tf.profiler.experimental.Trace(\"train\", step_num=step, _r=1):\n"
        "        train_step(x, y)\n"
        "tf.profiler.experimental.stop()"),
}

JAX: dict[str, Wording | None] = {
    **dict.fromkeys(PYTORCH_LIBRARIES),
    "dataloader_workers": Wording(
        "Prepare batches ahead of the step: grain workers and device prefetch",
        "loader = grain.DataLoader(data_source=source, sampler=sampler, operations=transforms,\n"
        "                          worker_count=8,          # load and transform in 8 processes\n"
        "                          worker_buffer_size=2)    # batches each worker keeps ready\n"
        "def prefetch(batches, size=2):                     # keep `size` batches on the device ahead\n"
        "    queue = collections.deque()\n"
        "    for batch in batches:\n"
        "        queue.append(jax.device_put(batch))        # asynchronous: copies while the step runs\n"
        "        if len(queue) == size:\n"
        "            yield queue.popleft()\n"
        "    yield from queue\n"
        "# with flax: flax.jax_utils.prefetch_to_device(batches, 2) for pmap-sharded batches"),
    "remove_host_sync": Wording(
        "Stop waiting for the device every step (block_until_ready, float(x), .item(), printing arrays)",
        "losses.append(loss)                       # a device array: no wait\n"
        "if step % 100 == 0:\n"
        "    print(float(jnp.mean(jnp.stack(losses)))); losses.clear()   # one wait per 100 steps\n"
        "# no jax.block_until_ready(...) in the loop; find implicit transfers with\n"
        "# jax.transfer_guard(\"disallow\")"),
    "pinned_memory_non_blocking": Wording(
        "Copy batches to the device ahead of the step",
        "next_batch = jax.device_put(next(batches), sharding)   # issued before the step: copies while it runs\n"
        "state, loss = train_step(state, batch)\n"
        "batch = next_batch"),
    "cuda_graphs": Wording(
        "Launch-bound: compile more of the loop into one program",
        "@functools.partial(jax.jit, donate_argnums=(0,))   # one program per step; the old state's buffers reused\n"
        "def train_steps(state, batches):                  # k steps per call\n"
        "    return jax.lax.scan(train_step, state, batches)"),
    "larger_batch": Wording(
        "Tiny kernels starve the GPU: double the per-GPU batch (scale the learning rate with it)", _BATCH),
    "move_cpu_work": Wording(
        "Host-side Python between steps holds the GPU back",
        "# move preprocessing into grain transforms (worker processes) or into the jitted step,\n"
        "# and keep Python out of the loop: @functools.partial(jax.jit, donate_argnums=(0,))"),
    "tf32": Wording(
        "Matrix multiplies and convolutions run in plain float32: let XLA use TensorFloat-32 (one line)",
        "jax.config.update(\"jax_default_matmul_precision\", \"tensorfloat32\")   # fp32 arrays kept\n"
        "# or around the step only: with jax.default_matmul_precision(\"tensorfloat32\"): ..."),
    "mixed_precision": Wording(
        "Matrix multiplies and convolutions run in float32: compute in {dtype}",
        "params = jax.tree_util.tree_map(lambda p: p.astype(jnp.{dtype}), params)   # compute copy\n"
        "# flax: nn.Dense(features, dtype=jnp.{dtype}, param_dtype=jnp.float32)\n"
        "# float16 needs loss scaling; bfloat16 does not"),
    "cudnn_benchmark": Wording(
        "Convolutions dominate: let XLA autotune them",
        "# XLA autotunes convolution algorithms at compile time; keep it on (do not lower\n"
        "# XLA_FLAGS=--xla_gpu_autotune_level) and keep input shapes fixed so compiled programs are reused"),
    "ddp_no_sync": Wording(
        "Gradients are all-reduced on every micro-batch: accumulate them and reduce once per step",
        "def grads_of(params, micro_batches):            # inside the jitted step\n"
        "    def body(acc, mb):\n"
        "        return jax.tree_util.tree_map(jnp.add, acc, jax.grad(loss_fn)(params, mb)), None\n"
        "    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)\n"
        "    grads, _ = jax.lax.scan(body, zeros, micro_batches)\n"
        "    return jax.lax.pmean(grads, axis_name=\"batch\")   # one all-reduce per step"),
    "ddp_bucket_cap": Wording(
        "Many small all-reduces per step: combine them and overlap them with compute",
        "XLA_FLAGS=\"--xla_gpu_enable_latency_hiding_scheduler=true "
        "--xla_gpu_all_reduce_combine_threshold_bytes=134217728\" python train.py"),
    "zero_grad_set_to_none": None,
    "comm_compression": Wording(
        "fp32 gradient all-reduces are exposed: reduce gradients in bfloat16",
        "grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.bfloat16), grads)\n"
        "grads = jax.lax.pmean(grads, axis_name=\"batch\")   # half the bytes on the wire\n"
        "grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), grads)"),
    "nccl_transport": Wording(
        "Large all-reduces reach little bus bandwidth: check the NCCL transport", _NCCL),
    "moe_all_to_all_overlap": Wording(
        "All-to-all (expert dispatch and combine) is exposed: overlap it with the experts' compute",
        "# let XLA schedule the dispatch/combine all-to-alls under independent compute\n"
        "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true python train.py\n"
        "# uneven experts make every device wait for the busiest: check the router's load-balancing loss"),
    "comm_bound_batch": Wording(
        "Communication takes as long as compute: more work per all-reduce, overlapped",
        "# raise the per-GPU batch (scale the learning rate linearly), or accumulate micro-batches with\n"
        "# jax.lax.scan and all-reduce once; overlap the rest:\n"
        "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true python train.py"),
    "record_cpu_activity": Wording(
        "The profile cannot explain most of the idle time: record host activity with it",
        "options = jax.profiler.ProfileOptions()\n"
        "options.host_tracer_level = 2; options.python_tracer_level = 1\n"
        "with jax.profiler.trace(\"logs\", profiler_options=options):\n"
        "    for step in range(5):\n"
        "        with jax.profiler.StepTraceAnnotation(\"train\", step_num=step):\n"
        "            state, loss = train_step(state, next(batches))\n"
        "    jax.block_until_ready(loss)"),
}

GRAPH_FIXES: dict[str, tuple[str, str]] = {
    "eager": (
        "Launch-bound: capture the step with CUDA graphs (torch.compile mode=\"reduce-overhead\")",
        "model = torch.compile(model, mode=\"reduce-overhead\")   # fuses kernels and replays CUDA graphs\n"
        "# static shapes required; or capture by hand: torch.cuda.make_graphed_callables(model, (sample_input,))"),
    "compiled": (
        "Launch-bound although compiled: let torch.compile replay CUDA graphs (mode=\"reduce-overhead\")",
        "model = torch.compile(model, mode=\"reduce-overhead\")   # the default mode still launches each kernel\n"
        "# graph breaks split the capture: TORCH_LOGS=graph_breaks python {script} lists them"),
    "cuda_graphs": (
        "Launch-bound outside the replayed CUDA graphs: capture the rest of the step",
        "# the step already replays graphs; the launches left run eagerly between them. Find what stays out:\n"
        "TORCH_LOGS=graph_breaks,cudagraphs python {script}     # graph breaks and skipped cudagraph captures\n"
        "# then capture the remaining part: torch.cuda.make_graphed_callables(part, (sample_input,))"),
    "vllm": (
        "Launch-bound: run vLLM with CUDA graphs (it runs eagerly now)",
        "llm = LLM(model=model_name, enforce_eager=False)   # vLLM captures decode steps in CUDA graphs\n"
        "# server: vllm serve MODEL without --enforce-eager"),
    "sglang": (
        "Launch-bound: run SGLang with CUDA graphs (it runs eagerly now)",
        "python -m sglang.launch_server --model-path MODEL   # without --disable-cuda-graph\n"
        "# more batch sizes captured: --cuda-graph-max-bs 256"),
}
"""The CUDA-graph fix that fits how the program already runs: what to do differs for eager PyTorch, a model
already under torch.compile, a step that replays graphs, and a serving engine with its own graph mode.
``{script}`` is the program run: ``train.py`` for a training step, ``serve.py`` for inference."""


def graph_fix(workload: Workload | None) -> tuple[str, str] | None:
    """Title and fix for launch overhead, or None where no fix of this kind is left (an engine replaying graphs)."""
    if workload is None:
        return GRAPH_FIXES["eager"]
    if workload.engine is not None:
        return None if workload.execution == "cuda_graphs" else GRAPH_FIXES[workload.engine]
    title, fix = GRAPH_FIXES[workload.execution]
    return title, fix.replace("{script}", "serve.py" if workload.mode == "inference" else "train.py")


ENGINE_BATCH: dict[str, tuple[str, str]] = {
    "vllm": (
        "Tiny kernels starve the GPU: let vLLM batch more sequences per step",
        "vllm serve MODEL --max-num-seqs N --max-num-batched-tokens T   # N, T: about twice the values in use now\n"
        "# offline: LLM(model=model_name, max_num_seqs=N, max_num_batched_tokens=T)\n"
        "# the KV cache must hold them (--gpu-memory-utilization), and enough requests must be in flight"),
    "sglang": (
        "Tiny kernels starve the GPU: let SGLang run more requests per step",
        "python -m sglang.launch_server --model-path MODEL --max-running-requests N --cuda-graph-max-bs N\n"
        "# N: about twice the batch in use now; the KV cache must hold them (--mem-fraction-static),\n"
        "# and enough requests must be in flight"),
}
"""The larger-batch fix of a serving engine: its scheduler's limits, not the model's call."""
ENGINE_PRECISION: dict[str, str] = {
    "vllm": 'vllm serve MODEL --dtype {dtype}   # offline: LLM(model=model_name, dtype="{dtype}")',
    "sglang": "python -m sglang.launch_server --model-path MODEL --dtype {dtype}",
}
"""The mixed-precision fix of a serving engine: the dtype it loads and runs the model in ({dtype}: the one the
device's matrix units take)."""


def engine_batch(workload: Workload | None) -> tuple[str, str] | None:
    return ENGINE_BATCH.get(workload.engine) if workload is not None and workload.engine else None


def engine_precision(workload: Workload | None, dtype: str) -> str | None:
    fix = ENGINE_PRECISION.get(workload.engine) if workload is not None and workload.engine else None
    return fix.replace("{dtype}", dtype) if fix is not None else None


KERAS: dict[str, Wording | None] = {
    **dict.fromkeys(PYTORCH_LIBRARIES),
    "dataloader_workers": Wording(
        "Prepare batches ahead of the step: a parallel tf.data pipeline, or PyDataset workers",
        "dataset = (dataset                                                 # Keras takes tf.data on every backend\n"
        "           .map(parse, num_parallel_calls=tf.data.AUTOTUNE)       # decode on every core\n"
        "           .batch(batch_size)\n"
        "           .prefetch(tf.data.AUTOTUNE))                           # batches ready while the step runs\n"
        "class Batches(keras.utils.PyDataset):                              # or load in worker processes\n"
        "    def __init__(self, files):\n"
        "        super().__init__(workers=8, use_multiprocessing=True, max_queue_size=16)"),
    "remove_host_sync": Wording(
        "fit waits for every batch's logs: read them less often, or off the training thread",
        "model.compile(optimizer, loss, steps_per_execution=32)   # the logs are read once per 32 batches\n"
        "# a callback of yours with on_train_batch_end makes fit read each batch's logs from the device\n"
        "# (a wait) before it goes on; if it only logs them, let Keras call it on another thread:\n"
        "class LossLogger(keras.callbacks.Callback):\n"
        "    async_safe = True"),
    "pinned_memory_non_blocking": None,
    "cuda_graphs": Wording(
        "Launch-bound: keep the step one compiled XLA program, with more work in it",
        "model.compile(optimizer, loss, jit_compile=True)   # the JAX backend's default; not run_eagerly=True\n"
        + _BATCH + "model.fit(dataset.batch(batch_size), epochs=epochs)"),
    "larger_batch": Wording(
        "Tiny kernels starve the GPU: double the per-GPU batch (scale the learning rate with it)",
        _BATCH + "model.fit(x, y, batch_size=batch_size)   # or dataset.batch(batch_size)\n"
        "model.compile(keras.optimizers.SGD(learning_rate), loss)"),
    "move_cpu_work": Wording(
        "Host-side Python between steps holds the GPU back",
        "# move preprocessing into the input pipeline, where it runs ahead of the step:\n"
        "dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)   # or PyDataset(workers=8)\n"
        "# and keep per-batch callbacks light: they run on the training thread between steps"),
    "tf32": Wording(
        "Matrix multiplies and convolutions run in plain float32: let XLA use TensorFloat-32 (one line)",
        "jax.config.update(\"jax_default_matmul_precision\", \"tensorfloat32\")   # fp32 arrays kept\n"
        "# or around the step only: with jax.default_matmul_precision(\"tensorfloat32\"): ..."),
    "mixed_precision": Wording(
        "Matrix multiplies and convolutions run in float32: use Keras mixed precision",
        "keras.mixed_precision.set_global_policy(\"mixed_{dtype}\")   # before building the model\n"
        "# mixed_float16: compile wraps the optimizer in keras.optimizers.LossScaleOptimizer"),
    "cudnn_benchmark": JAX["cudnn_benchmark"],
    "ddp_no_sync": Wording(
        "Gradients are all-reduced on every micro-batch: accumulate them and reduce once per step",
        "optimizer = keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=4)"),
    "ddp_bucket_cap": JAX["ddp_bucket_cap"],
    "zero_grad_set_to_none": None,
    "comm_compression": None,
    "nccl_transport": JAX["nccl_transport"],
    "moe_all_to_all_overlap": Wording(
        "All-to-all (expert dispatch and combine) is exposed: overlap it with the experts' compute",
        "# let XLA schedule the dispatch/combine all-to-alls under independent compute\n"
        "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true python train.py\n"
        "# uneven experts make every device wait for the busiest: check the router's load-balancing loss"),
    "comm_bound_batch": Wording(
        "Communication takes as long as compute: more work per all-reduce, overlapped",
        "optimizer = keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=4)   # or a larger batch\n"
        "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true python train.py"),
    "record_cpu_activity": Wording(
        UNEXPLAINED_BY_TRACKER,
        "options = jax.profiler.ProfileOptions()\n"
        "options.host_tracer_level = 2; options.python_tracer_level = 1\n"
        "with jax.profiler.trace(\"logs\", profiler_options=options):\n"
        "    model.fit(dataset, epochs=1, steps_per_epoch=20)"),
}
"""Keras 3 on the JAX backend (the Keras callback's steps): Keras's own API, the input pipeline Keras takes on every
backend, and XLA's flags where the work is the compiled program's."""

WORDINGS: dict[str, dict[str, Wording | None]] = {"tensorflow": TENSORFLOW, "jax": JAX, "keras": KERAS}
"""Per framework, per rule id; a framework absent here (PyTorch) keeps the rules' own texts."""

STRAGGLER = "straggler_rank_"
"""Straggler fixes (one id per rank) name the input pipeline to check: in the framework's words."""
INPUT_PIPELINE = {"tensorflow": "its tf.data pipeline (num_parallel_calls, prefetch)",
                  "jax": "its grain workers (worker_count) and device prefetch",
                  "keras": "its tf.data pipeline (num_parallel_calls, prefetch) or PyDataset workers"}


def in_framework(proposals: list[Proposal], framework: str | None) -> list[Proposal]:
    """The proposals with the framework's titles and fixes; those with no counterpart left out."""
    table = WORDINGS.get(framework or "")
    if table is None:
        return proposals
    out = []
    for p in proposals:
        if p.rec.id.startswith(STRAGGLER):
            fix = p.rec.fix.replace("its DataLoader workers", INPUT_PIPELINE[framework or ""])
            out.append(msgspec.structs.replace(p, rec=msgspec.structs.replace(p.rec, fix=fix)))
            continue
        if p.rec.id not in table:
            out.append(p)
            continue
        wording = table[p.rec.id]
        if wording is None:
            continue
        dtype = "float16" if p.rec.evidence.get("dtype") == "fp16" else "bfloat16"
        title = UNEXPLAINED_BY_TRACKER if p.rec.title == UNEXPLAINED_BY_TRACKER else wording.title
        rec = msgspec.structs.replace(p.rec, title=title.replace("{dtype}", dtype),
                                      fix=wording.fix.replace("{dtype}", dtype))
        out.append(msgspec.structs.replace(p, rec=rec))
    return out
