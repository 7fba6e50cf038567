"""Record real JAX and TensorFlow profiles on the CPU (host planes only), in a subprocess each.

Each script runs five steps marked with the framework's step annotation; TensorFlow's reads
its batches from a tf.data pipeline. A GPU plane can be added afterwards
(:func:`add_gpu_plane`) to make a host profile analysable.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

JAX_SCRIPT = """
import sys, numpy as np, jax, jax.numpy as jnp
@jax.jit
def train_step(w, x):
    return w - 0.01 * jnp.tanh(x @ w).sum() * w
w = jnp.ones((64, 64))
train_step(w, jnp.ones((32, 64))).block_until_ready()
with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
    for step in range(5):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            x = jax.device_put(np.random.rand(32, 64).astype(np.float32))
            w = train_step(w, x)
            w.block_until_ready()
"""

TF_SCRIPT = """
import sys, numpy as np, tensorflow as tf
ds = tf.data.Dataset.from_tensor_slices(np.random.rand(256, 16).astype("float32"))
ds = ds.map(lambda x: x * 2).batch(32).prefetch(2)
w = tf.Variable(tf.ones((16, 4)))
@tf.function
def train_step(x):
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
    w.assign_sub(0.01 * t.gradient(loss, w))
    return loss
it = iter(ds)
train_step(next(it))
tf.profiler.experimental.start(sys.argv[1])
for step in range(5):
    with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
        loss = train_step(next(it))
        float(loss)
tf.profiler.experimental.stop()
"""


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def record(script: str, logdir: Path) -> Path:
    """Run ``script`` with ``logdir``; return the run folder it wrote (``plugins/profile/<run>``)."""
    subprocess.run([sys.executable, "-c", script, str(logdir)], check=True, capture_output=True, timeout=600,
                   env={"TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "",
                        "PATH": "/usr/bin:/bin"})
    runs = sorted((logdir / "plugins" / "profile").iterdir())
    return runs[-1]


def add_gpu_plane(pb: Path, out: Path, kernels: list[tuple[int, int]]) -> None:
    """Write ``out``: the profile at ``pb`` plus a ``/device:GPU:0`` plane whose stream holds
    ``kernels`` as ``(start, end)`` in the host plane's clock (ns), unlinked to any launch."""
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(pb.read_bytes())
    plane = space.planes.add(name="/device:GPU:0", id=99)
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "volta_sgemm_128x64_nn"
    line = plane.lines.add(id=7, name="Stream #7(Kernel)", timestamp_ns=0)
    for start, end in kernels:
        line.events.add(metadata_id=1, offset_ps=start * 1000, duration_ps=(end - start) * 1000)
    out.write_bytes(space.SerializeToString())


EXPORT_SCRIPT = """
import sys
from jax._src.lib import _profiler
session = _profiler.ProfilerSession()
session.stop()
session.export(open(sys.argv[2], "rb").read(), sys.argv[1])
"""
"""jaxlib's own export of a serialized XSpace: what ``jax.profiler.trace`` writes (``.xplane.pb`` and
``.trace.json.gz``), here for a profile recorded elsewhere."""


def export_with_jax(pb: Path, logdir: Path) -> Path:
    """The run folder jaxlib writes for ``pb`` (its ``*.trace.json.gz`` is JAX's JSON of that profile)."""
    subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(logdir), str(pb)], check=True, capture_output=True,
                   timeout=600, env={"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    return sorted((logdir / "plugins" / "profile").iterdir())[-1]
