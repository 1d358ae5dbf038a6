"""FSDP2 with memory tracking: the same script, sharded by the launcher, reports what each process holds.

    accelerando launch --cpu --num_processes 2 --use_fsdp --fsdp_version 2 examples/by_feature/fsdp_with_peak_mem_tracking.py
    accelerando launch --cpu --num_processes 2 examples/by_feature/fsdp_with_peak_mem_tracking.py   # DDP, to compare

Nothing in the code chooses FSDP: the launch flags (or a config file) do. Each process prints the
bytes of parameters it stores (half of the model on 2 processes under FSDP2, all of it under DDP)
and its peak memory: the accelerator's allocator peak on a GPU, the process's peak RSS on CPU.
"""

from __future__ import annotations

import resource

import torch
from _common import CLASSES, FEATURES, base_parser, evaluate, make_loaders

from accelerando import Accelerator
from accelerando.utils import set_seed


class Block(torch.nn.Module):
    """A residual MLP block: FSDP2 wraps each one (repeated layers are its default unit)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = (
            torch.nn.LayerNorm(width),
            torch.nn.Linear(width, 4 * width),
            torch.nn.Linear(4 * width, width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def local_parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes this process stores: a DTensor (FSDP2) counts only its local shard."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def peak_memory(device: torch.device) -> str:
    if device.type != "cpu":
        return f"{torch.accelerator.max_memory_allocated(device) / 2**20:.1f} MiB allocated"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB RSS"


def main() -> None:
    args = base_parser(__doc__.splitlines()[0]).parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    train, evaluation = make_loaders(args.batch_size)
    model = Net()
    full_bytes = local_parameter_bytes(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    for epoch in range(args.epochs):
        for x, y in train:
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        accuracy, _ = evaluate(accelerator, model, evaluation)
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}")
    print(
        f"rank={accelerator.process_index} distributed_type={accelerator.distributed_type} "
        f"parameter_bytes={local_parameter_bytes(model)} of {full_bytes} peak={peak_memory(accelerator.device)}",
        flush=True,
    )
    accelerator.wait_for_everyone()
    accelerator.print(f"accuracy={accuracy:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
