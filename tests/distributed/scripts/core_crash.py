"""Rank 1 raises while rank 0 waits in a collective: the job must end quickly with rank 1's error."""

import torch

from accelerando import Accelerator

acc = Accelerator()
if acc.process_index == 1:
    raise RuntimeError("rank one exploded on purpose")
acc.reduce(torch.ones(1))  # rank 0 blocks here until the launcher stops it
