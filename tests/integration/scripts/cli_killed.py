"""Rank 1 SIGKILLs itself mid-training; rank 0 then fails in its next all_reduce ("Connection reset")."""

import os
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(10_000):
    if dist.get_rank() == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    t.fill_(1.0)
