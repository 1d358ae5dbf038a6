"""Started by `accelerando launch`: report what the FSDP settings became inside the processes."""

from __future__ import annotations

import json
import sys

import torch
from torch.distributed.tensor import DTensor

from accelerando import Accelerator

acc = Accelerator()
model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)))
plugin = acc.strategy.plugin
report = {
    "rank": acc.process_index,
    "distributed_type": str(acc.distributed_type),
    "reshard_after_forward": plugin.reshard_after_forward,
    "auto_wrap_policy": plugin.auto_wrap_policy,
    "min_num_params": plugin.min_num_params,
    "state_dict_type": plugin.state_dict_type,
    "units": len(acc.strategy.plans[0].modules),
    "sharded": all(isinstance(p, DTensor) for p in model.parameters()),
}
sys.stdout.write("RESULT " + json.dumps(report) + "\n")  # one write: ranks' lines never interleave
sys.stdout.flush()
