"""Launched by the CLI tests: joins the gloo group and reports what the launcher handed over."""

import json
import os
import sys

import torch
import torch.distributed as dist


def say(line: str) -> None:
    """One write per line, so lines of concurrent ranks never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
keys = ["ACCELERANDO_USE_CPU", "ACCELERANDO_MIXED_PRECISION", "ACCELERANDO_DYNAMO_BACKEND", "FSDP_VERSION",
        "ACCELERANDO_GRADIENT_ACCUMULATION_STEPS", "GROUP_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
        "TORCHELASTIC_RESTART_COUNT"]  # fmt: skip
report = {k: os.environ.get(k) for k in keys}
report.update(rank=dist.get_rank(), world=dist.get_world_size(), sum=total.item(), argv=sys.argv[1:])
say("REPORT " + json.dumps(report))
dist.destroy_process_group()
