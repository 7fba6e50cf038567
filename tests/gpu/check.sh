#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one run: NVML sampling, the tracker's device timing, and a
# before/after gain prediction on real traces; then the JAX tracker's loop tests and the Keras callback's on Keras's
# JAX backend on the GPU (skipped where JAX sees no GPU, or Keras is not installed). Run from the repository root
# on a machine with a GPU and the CUDA build of torch:  bash tests/gpu/check.sh   (PYTHON names the interpreter; python3 by default;
# GPUIDLE_KEEP_TRACES=DIR keeps the before/after trace pair; GPUIDLE_GPU_COSTS=1 also measures what the JAX tracker
# and the Keras callback on JAX cost a step on the GPU; not yet run on one)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))"
"$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/gpu "$@"
if "$PYTHON" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
    GPUIDLE_JAX_PLATFORMS=cuda "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/test_tracker_jax.py \
        tests/test_tracker_keras_jax.py -k "data_delay or float_loss or never_promises or slow_input or data_fix"
    if [ "${GPUIDLE_GPU_COSTS:-0}" = 1 ]; then
        "$PYTHON" bench/tracker_overhead_frameworks.py --only jax --dim 8192 --block 30 --rounds 12 --held
        "$PYTHON" bench/tracker_overhead_frameworks.py --only keras-jax --dim 8192 --block 30 \
            --rounds 12 --held
    fi
else
    echo "JAX sees no GPU: its tracker tests on the GPU skipped"
fi
