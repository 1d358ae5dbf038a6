"""The end-to-end check `accelerando test` launches on every configured process.

Uses only the public API, as a user's script would: the processes find each other, collectives
agree, and one DDP training step keeps the model identical on every rank.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from accelerando import Accelerator


def main() -> int:
    accelerator = Accelerator()
    n, rank = accelerator.num_processes, accelerator.process_index
    checks: list[tuple[str, bool]] = []
    value = torch.tensor([float(rank + 1)], device=accelerator.device)
    checks.append(("gather", accelerator.gather(value).cpu().tolist() == [float(i + 1) for i in range(n)]))
    total = accelerator.reduce(value.clone(), reduction="sum").item()
    checks.append(("reduce", total == n * (n + 1) / 2))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared: Any = accelerator.prepare(model, optimizer)
    model, optimizer = prepared
    inputs = torch.full((2, 4), float(rank + 1), device=accelerator.device)
    loss = model(inputs).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    net: Any = accelerator.unwrap_model(model)
    weight = net.weight.detach().flatten()
    gathered = accelerator.gather(weight[None]).reshape(n, -1)
    checks.append(("training step in sync", bool(torch.allclose(gathered, gathered[0].expand_as(gathered)))))
    accelerator.wait_for_everyone()
    failed = [name for name, ok in checks if not ok]
    if failed:
        print(f"[rank {rank}] FAILED checks: {', '.join(failed)}", flush=True)
        return 1
    accelerator.print(
        f"accelerando test: {len(checks)} checks passed on {n} process(es), "
        f"{accelerator.distributed_type} on {accelerator.device.type}, mixed precision {accelerator.mixed_precision}"
    )
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
