#!/usr/bin/env bash
# Run HERE (a machine with the package index) before a GPU session: fills .gpu-wheels/ (git-ignored,
# about 20 MB) with the wheels the GPU checks need and the GPU machine lacks (it has torch, CUDA,
# accelerate and transformers, and no network). run_gpu_checks.sh installs from that folder only
# the distributions its Python does not already have, so the machine's own versions always win.
#   bash tests/gpu/bring_wheels.sh      # then carry .gpu-wheels with the code to the GPU machine
# Brought: torchao (fp8; its float8 training is Python over torch._scaled_mm, so the C++ extension
# of another torch build is not needed), DeepSpeed built as a pure-Python wheel (DS_BUILD_OPS=0;
# ops it needs on the GPU are JIT-built there) and DeepSpeed's small dependencies, binary ones for
# CPython 3.10 to 3.13. Not brought: Transformer Engine (its CUDA wheels are several hundred MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
DEST=.gpu-wheels
mkdir -p "$DEST"
pip_() { "$PYTHON" -m pip "$@" --disable-pip-version-check -q; }

pip_ download --no-deps -d "$DEST" torchao==0.18.0
DS_BUILD_OPS=0 pip_ wheel --no-deps --no-build-isolation -w "$DEST" deepspeed==0.19.8
pip_ download --no-deps -d "$DEST" hjson py-cpuinfo einops tqdm packaging annotated-types \
  typing-inspection typing-extensions pydantic==2.14.4 ninja psutil  # pydantic pins its core
for version in 3.10 3.11 3.12 3.13; do  # one build per CPython for the packages with C code
  pip_ download --no-deps --only-binary=:all: --python-version "$version" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$DEST" msgpack pydantic-core==2.50.5
done
du -sh "$DEST"
ls "$DEST"
