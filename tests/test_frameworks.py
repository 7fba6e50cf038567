"""TensorFlow and JAX fix texts: one for every rule, and every API they name exists in the installed package."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuidle.advice import cuda, frameworks, precision, rules
from gpuidle.advice.whatif import Effect, Proposal, placeholder
from gpuidle.model import Recommendation


def _rule_ids() -> set[str]:
    """Every rule id the advice modules fire, whichever module a rule lives in: ``x.rec("id", ...)``, and the ids
    of the rule made per mesh dimension (``tp_comm_overlap``, ``cp_comm_overlap``)."""
    source = "".join(p.read_text() for p in sorted(Path(rules.__file__).parent.glob("*.py")))
    return set(re.findall(r'x\.rec\(\s*"(\w+)"', source)) | set(re.findall(r'"(\w+_comm_overlap)"', source))


@pytest.mark.parametrize("framework", sorted(frameworks.WORDINGS))
def test_every_rule_has_a_wording(framework: str) -> None:
    """Each rule says its fix in the framework's API, or ``None``: not in this stack (never PyTorch's text)."""
    ids = _rule_ids()
    assert len(ids) >= 34
    assert set(frameworks.WORDINGS[framework]) == ids


def test_every_rule_has_a_cuda_wording_or_is_pytorchs() -> None:
    """For a CUDA program each rule is worded in CUDA's API or is left out as PyTorch's; none keeps PyTorch's text."""
    ids = _rule_ids()
    assert ids - set(cuda.CUDA_FIXES) - cuda.PYTORCH_ONLY == set()


def test_in_framework_rewrites_and_drops() -> None:
    def prop(id: str, **evidence: object) -> Proposal:
        rec = Recommendation(id=id, cause="host_sync", title="torch title", evidence=dict(evidence),
                             fix="torch.cuda.synchronize()", gain=placeholder(), confidence="high", rank=0)
        return Proposal(rec, {0: Effect(idle={"host_sync": 0.01})})

    out = frameworks.in_framework([prop("mixed_precision", dtype="fp16"), prop("comm_compression")], "tensorflow")
    assert [p.rec.id for p in out] == ["mixed_precision"]
    assert 'set_global_policy("mixed_float16")' in out[0].rec.fix
    assert out[0].effects == {0: Effect(idle={"host_sync": 0.01})}
    (jax_bf16,) = frameworks.in_framework([prop("mixed_precision", dtype="bf16")], "jax")
    assert "jnp.bfloat16" in jax_bf16.rec.fix
    assert frameworks.in_framework([prop("remove_host_sync")], None)[0].rec.fix == "torch.cuda.synchronize()"


@pytest.mark.parametrize(("framework", "words"), [("tensorflow", "tf.data"), ("jax", "grain"), ("keras", "PyDataset")])
def test_straggler_fix_names_the_frameworks_input_pipeline(framework: str, words: str) -> None:
    rec = Recommendation(id="straggler_rank_3", cause="straggler_wait", title="Rank 3 is a straggler", evidence={},
                         fix=rules.STRAGGLER_FIX["data_loading"], gain=placeholder(), confidence="medium", rank=3)
    (out,) = frameworks.in_framework([Proposal(rec, {3: Effect(busy=0.1)})], framework)
    assert "DataLoader" not in out.rec.fix
    assert words in out.rec.fix


def _params(fn: Callable[..., object]) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_tensorflow_apis_exist() -> None:
    tf = pytest.importorskip("tensorflow")
    ds = tf.data.Dataset
    for name in ("interleave", "map", "cache", "shuffle", "batch", "prefetch", "apply", "list_files", "take"):
        assert hasattr(ds, name), name
    assert {"cycle_length", "num_parallel_calls", "deterministic"} <= _params(ds.interleave)
    assert "num_parallel_calls" in _params(ds.map)
    assert tf.data.AUTOTUNE == -1
    assert callable(tf.data.TFRecordDataset)
    assert callable(tf.data.experimental.prefetch_to_device)
    assert "cross_device_ops" in _params(tf.distribute.MirroredStrategy.__init__)
    assert "num_packs" in _params(tf.distribute.NcclAllReduce.__init__)
    assert "communication_options" in _params(tf.distribute.MultiWorkerMirroredStrategy.__init__)
    tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=50 * 1024 * 1024, implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
    assert hasattr(tf.distribute.Strategy, "experimental_distribute_dataset")
    assert callable(tf.keras.mixed_precision.set_global_policy)
    assert callable(tf.keras.mixed_precision.LossScaleOptimizer)
    assert tf.config.experimental.tensor_float_32_execution_enabled()  # the default the tf32 fix restores
    assert callable(tf.config.experimental.enable_tensor_float_32_execution)
    assert "jit_compile" in _params(tf.function)
    assert {"jit_compile", "steps_per_execution"} <= _params(tf.keras.Model.compile)
    assert "gradient_accumulation_steps" in _params(tf.keras.optimizers.SGD.__init__)
    mean = tf.keras.metrics.Mean
    assert all(hasattr(mean, m) for m in ("update_state", "result", "reset_state"))
    assert {"host_tracer_level", "python_tracer_level", "device_tracer_level"} <= _params(
        tf.profiler.experimental.ProfilerOptions)
    assert "options" in _params(tf.profiler.experimental.start)
    with tf.profiler.experimental.Trace("train", step_num=0, _r=1):
        pass


def test_torch_tf32_apis_exist() -> None:
    """The tf32 fix's PyTorch lines set what they say (checked on a copy of the settings, restored after)."""
    torch = pytest.importorskip("torch")
    matmul, conv = torch.get_float32_matmul_precision(), torch.backends.cudnn.conv.fp32_precision
    try:
        exec(compile(precision.TF32_FIX, "tf32_fix", "exec"), {"torch": torch})
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.conv.fp32_precision = conv


def test_jax_apis_exist() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    assert "donate_argnums" in _params(jax.jit)
    for fn in (jax.device_put, jax.block_until_ready, jax.transfer_guard, jax.lax.scan, jax.lax.pmean,
               jax.tree_util.tree_map, jax.grad, jnp.stack, jnp.mean, jnp.zeros_like, jnp.add):
        assert callable(fn)
    assert jnp.bfloat16 is not None
    with jax.default_matmul_precision("tensorfloat32"):
        assert jax.config.jax_default_matmul_precision == "tensorfloat32"
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level, options.python_tracer_level = 2, 1
    assert "profiler_options" in _params(jax.profiler.trace)
    with jax.profiler.StepTraceAnnotation("train", step_num=0):
        pass


def test_keras_apis_exist() -> None:
    """What the Keras-on-JAX fixes name, in Keras 3's own namespace (every backend has it)."""
    keras = pytest.importorskip("keras")
    assert {"workers", "use_multiprocessing", "max_queue_size"} <= _params(keras.utils.PyDataset.__init__)
    assert {"jit_compile", "steps_per_execution"} <= _params(keras.Model.compile)
    assert "batch_size" in _params(keras.Model.fit)
    assert "gradient_accumulation_steps" in _params(keras.optimizers.SGD.__init__)
    assert callable(keras.mixed_precision.set_global_policy)
    assert isinstance(keras.optimizers.LossScaleOptimizer, type)
    assert "auto_scale_loss" in _params(keras.Model.compile)  # mixed_float16: compile wraps the optimizer
    # a callback's async_safe lets fit call it off the training thread, without reading each batch's logs first
    assert "async_safe" in inspect.getsource(type(keras.callbacks.CallbackList([])))


def test_xla_flags_exist_in_jaxlib() -> None:
    """The XLA flags the fixes name are flags of the installed XLA (their names are in its library)."""
    jaxlib = pytest.importorskip("jaxlib")
    flags = {"xla_gpu_enable_latency_hiding_scheduler", "xla_gpu_all_reduce_combine_threshold_bytes",
             "xla_gpu_autotune_level"}
    found: set[str] = set()
    for lib in Path(jaxlib.__file__).parent.glob("*.so"):
        data = lib.read_bytes()
        found |= {f for f in flags if f.encode() in data}
    assert found == flags


def test_flax_and_grain_apis_exist() -> None:
    jax_utils = pytest.importorskip("flax.jax_utils")
    assert callable(jax_utils.prefetch_to_device)
    import flax.linen as nn

    assert {"dtype", "param_dtype"} <= _params(nn.Dense)
    grain = pytest.importorskip("grain")
    loader = getattr(grain, "DataLoader", None) or pytest.importorskip("grain.python").DataLoader
    assert {"data_source", "sampler", "operations", "worker_count", "worker_buffer_size"} <= _params(loader)


@pytest.mark.parametrize("framework", [None, "tensorflow", "jax", "keras"])
def test_a_tracker_run_is_never_told_its_profile_cannot_explain(framework: str | None) -> None:
    """A step tracker's run has no profile: what it cannot explain is asked of a profile, in every framework's
    words, under the tracker's own title; a trace keeps the framework's."""
    def proposal(title: str) -> Proposal:
        rec = Recommendation(id="record_cpu_activity", cause="unattributed", title=title, evidence={}, fix="x",
                             gain=placeholder(), confidence="high", rank=0)
        return Proposal(rec, {0: Effect(reason="r")})

    (tracked,) = frameworks.in_framework([proposal(frameworks.UNEXPLAINED_BY_TRACKER)], framework)
    assert tracked.rec.title == frameworks.UNEXPLAINED_BY_TRACKER
    (traced,) = frameworks.in_framework([proposal("The trace cannot explain most of the idle time")], framework)
    assert "tracker" not in traced.rec.title or framework == "keras"  # Keras's runs are the tracker's only
