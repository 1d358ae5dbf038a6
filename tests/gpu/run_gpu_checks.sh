#!/usr/bin/env bash
# The FSDP checks for a GPU machine (nccl, bf16). Run from the repository root:
#   bash tests/gpu/run_gpu_checks.sh            # pytest -m cuda on the FSDP file, then the benchmark
# PYTHON overrides the interpreter (default: .venv/bin/python if present, else python).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
"$PYTHON" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device: these checks only run on the GPU machine"
print(f"CUDA devices: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY
"$PYTHON" -m pytest -m cuda tests/gpu/test_fsdp_cuda.py -q -x -p no:cacheprovider
"$PYTHON" benchmarks/fsdp.py --dim 2048 --depth 8 --batch 64 --steps 20
