"""Rank 1 raises right after joining; rank 0 would wait for a long time unless the launcher stops it."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")


def explode() -> None:
    raise ValueError(f"boom from rank {dist.get_rank()}")


if dist.get_rank() == 1:
    explode()
time.sleep(120)
