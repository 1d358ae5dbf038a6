"""Rank 0 raises while an all_reduce it started is still pending; rank 1 is busy elsewhere.

Left to the interpreter's exit, rank 0's gloo group waits for that all_reduce, so rank 0 never ends
and the launcher, seeing no process end, waits with it (until the group's 30-minute timeout).
"""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    pending = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    raise ValueError("rank 0 fails with an all_reduce pending")
time.sleep(600)
