"""dispatch_batches: one rank is killed (SIGKILL) mid-epoch; the other must raise, naming it.

Usage (as raw processes, no launcher to stop the survivor): data_dead_peer.py VICTIM ROUTE
VICTIM is the rank that dies (1: a receiver, 0: the sender), ROUTE "ring", "cross" (the receiver
reads rank 0's memory) or "gloo". The victim
prints the time it dies at; the survivor prints the time it raised at and the error, and exits
with status 3.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import accelerando.data.transport as transport
from accelerando.config.options import DataLoaderConfiguration
from accelerando.data import prepare_data_loader

victim, route = int(sys.argv[1]), sys.argv[2]
os.environ["ACCELERANDO_DISPATCH_CROSS_MEMORY"] = "1" if route == "cross" else "0"
dist.init_process_group("gloo")
rank = dist.get_rank()
if route == "gloo":
    transport.local_route = lambda group, channel: None  # what a rank on another host gets
loader = prepare_data_loader(
    DataLoader(torch.arange(4000.0).view(-1, 4), batch_size=4),
    num_processes=2,
    process_index=rank,
    device=None,
    config=DataLoaderConfiguration(dispatch_batches=True),
    gradient_state=None,
)
try:
    for step, _batch in enumerate(loader):
        if rank == victim and step == 10:
            print(f"DYING {time.time()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
except Exception as err:  # the survivor: report, and leave without tearing down a broken group
    print(f"RAISED {time.time()} {type(err).__name__}: {err}", flush=True)
    os._exit(3)
print("finished without noticing", flush=True)
os._exit(4)
