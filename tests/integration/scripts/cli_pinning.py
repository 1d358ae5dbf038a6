"""Launched by the CLI tests: reports the cores this rank may run on and torch's thread count."""

import json
import os
import sys

import torch

report = {
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "cores": sorted(os.sched_getaffinity(0)),
    "threads": torch.get_num_threads(),
}
sys.stdout.write("PINNING " + json.dumps(report) + "\n")
sys.stdout.flush()
