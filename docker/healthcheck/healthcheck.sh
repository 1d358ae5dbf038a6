#!/bin/sh
# The images' HEALTHCHECK: the install describes itself (`accelerando env`), then 2 processes find
# each other, agree on collectives and train one DDP step (`accelerando test`). Two CUDA devices:
# one process each over NCCL; fewer: 2 CPU processes over gloo, so the check runs on any host.
set -eu
here=$(dirname "$0")
accelerando env
gpus=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
config="$here/cpu.yaml"
if [ "$gpus" -ge 2 ]; then
    config="$here/gpu.yaml"
fi
exec accelerando test --config_file "$config"
