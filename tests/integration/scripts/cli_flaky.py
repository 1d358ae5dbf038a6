"""Fails on the first attempt only (rank 1), then succeeds after the agent restarts the group."""

import os
import sys

import torch
import torch.distributed as dist


def say(line: str) -> None:
    """One write per line, so lines of concurrent ranks never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0 and dist.get_rank() == 1:
    raise RuntimeError("first attempt fails on purpose")
total = torch.ones(1)
dist.all_reduce(total)
say(f"FLAKY rank {dist.get_rank()} attempt {attempt} sum {total.item()}")
dist.destroy_process_group()
