#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one run: NVML sampling, the tracker's device timing, and a
# before/after gain prediction on real traces. Run from the repository root on a machine with a GPU and
# the CUDA build of torch:  bash tests/gpu/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python -m pytest -q -p no:cacheprovider tests/gpu "$@"
