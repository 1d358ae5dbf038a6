"""FSDP2 + tensor parallelism on a 2 x 2 mesh (dp_shard=2, tp=2): 4 gloo ranks, so not part of the CI
suite (its budget runs 2-rank jobs); run by hand: `torchrun --nproc_per_node 4 tp_fsdp_4ranks.py`.
Checks the data split (TP peers read the same half, gather_for_metrics returns each sample once) and
gradients, clipping norm and parameters against one unsharded model on the global batch."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from accelerando import Accelerator
from accelerando.config.fsdp import FullyShardedDataParallelPlugin
from accelerando.parallelism_config import ParallelismConfig, TorchTensorParallelConfig


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def main() -> None:
    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    config = ParallelismConfig(dp_shard_size=2, tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=plan))
    acc = Accelerator(parallelism_config=config, fsdp_plugin=FullyShardedDataParallelPlugin())
    assert acc.data_parallel_size == 2 and acc.data_parallel_rank == dist.get_rank() // 2
    # data: the two ranks of a TP group read the same half; gather_for_metrics returns each sample once
    loader = acc.prepare(torch.utils.data.DataLoader(torch.arange(8), batch_size=2))
    mine = torch.cat(list(loader)).tolist()
    seen = [None] * 4
    dist.all_gather_object(seen, mine)
    assert seen[0] == seen[1] and seen[2] == seen[3] and sorted(seen[0] + seen[2]) == list(range(8)), seen
    gathered = torch.cat([acc.gather_for_metrics(b) for b in loader])
    assert sorted(gathered.tolist()) == list(range(8)), gathered
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    placements = {n: tuple(p.placements) for n, p in model.named_parameters()}
    assert all(len(pl) == 2 for pl in placements.values()), placements  # 2-D: dp_shard x tp
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
        half = slice(4 * acc.data_parallel_rank, 4 * acc.data_parallel_rank + 4)
        loss = torch.nn.functional.mse_loss(model(x[half]), y[half])
        ref_loss = torch.nn.functional.mse_loss(reference(x), y)
        acc.backward(loss)
        ref_loss.backward()
        for n, p in model.named_parameters():
            ref = dict(reference.named_parameters())[n].grad
            torch.testing.assert_close(full(p.grad), ref, rtol=1e-5, atol=1e-6, msg=n)
        norm = acc.clip_grad_norm_(model.parameters(), 0.5)
        ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        torch.testing.assert_close(full(norm).float(), ref_norm, rtol=1e-5, atol=1e-6)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for n, p in model.named_parameters():
        torch.testing.assert_close(
            full(p), dict(reference.named_parameters())[n].detach(), rtol=1e-5, atol=1e-6
        )
    print("FSDP_TP_4RANKS_OK")


if __name__ == "__main__":
    main()
