"""prepare_pippy on 2 gloo ranks: the last rank's output equals the unsplit model's output."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from accelerando.inference import generate_device_map, prepare_pippy


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Stack(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.layers = nn.Sequential(*(Block(dim) for _ in range(layers)))
        self.out = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(self.inp(x)))


def build() -> Stack:
    torch.manual_seed(0)
    return Stack().eval()


def main() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = build()(x)

    device_map = generate_device_map(build(), world, no_split_module_classes=["Block"])
    assert set(device_map.values()) == {0, 1}, device_map

    # automatic split points, output only on the last rank
    model = prepare_pippy(build(), no_split_module_classes=["Block"], example_args=(x,), num_chunks=4)
    assert len(model.hf_split_points) == 1 and model.hf_split_points[0].startswith("layers."), (
        model.hf_split_points
    )
    with torch.no_grad():
        out = model(x)
    if rank == world - 1:
        torch.testing.assert_close(out, expected)
    else:
        assert out is None

    # explicit split point, outputs gathered to every rank, default num_chunks (= world size)
    model = prepare_pippy(build(), split_points=["layers.2"], example_args=(x,), gather_output=True)
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out, expected)

    try:
        prepare_pippy(build(), split_points=["layers.1", "layers.2"], example_args=(x,))
    except ValueError as err:
        assert "2 split point(s)" in str(err)
    else:
        raise AssertionError("expected a ValueError for too many split points")
    dist.barrier()
    if rank == 0:
        print("pipeline checks passed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
