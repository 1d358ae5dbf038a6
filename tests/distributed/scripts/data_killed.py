"""dispatch_batches: rank 1 is killed (SIGKILL) mid-epoch while rank 0, running ahead, waits for it
to take its batches; the launcher then stops rank 0 with SIGTERM.

Neither rank runs any cleanup, yet nothing of the channel may be left in /dev/shm.
"""

import os
import signal

import torch
from torch.utils.data import DataLoader

from accelerando import Accelerator
from accelerando.config.options import DataLoaderConfiguration

acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
loader = acc.prepare(DataLoader(torch.arange(4000.0), batch_size=4))
for step, _batch in enumerate(loader):
    if acc.process_index == 1 and step == 10:
        os.kill(os.getpid(), signal.SIGKILL)
