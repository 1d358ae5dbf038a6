"""Shared pieces of the FSDP distributed scripts: a small block model, data, and a DDP reference."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

DIM = 16


class Block(torch.nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, dim: int = DIM, depth: int = 3) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def make_net(seed: int = 0, **kw: int) -> Net:
    torch.manual_seed(seed)
    return Net(**kw)


def batch(step: int, rows: int = 8, dim: int = DIM) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's half of a global batch that every rank generates identically."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(rows, dim, generator=g), torch.randn(rows, 1, generator=g)
    r, w = dist.get_rank(), dist.get_world_size()
    per = rows // w
    return x[r * per : (r + 1) * per], y[r * per : (r + 1) * per]


def ddp_reference(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, int], torch.Tensor],
    steps: int,
    accum: int = 1,
    clip: float | None = None,
    lr: float = 1e-2,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per micro-step and final parameters of a plain DDP run (the ground truth)."""
    model = DistributedDataParallel(copy.deepcopy(model))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        sync = (step + 1) % accum == 0
        ctx = model.no_sync() if not sync else _null()
        with ctx:
            loss = loss_fn(model, step)
            (loss / accum).backward()
        losses.append(loss.item())
        if sync:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return losses, {k: v.detach().clone() for k, v in model.module.state_dict().items()}


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer unsharded (DTensor.full_tensor), on every rank."""
    from torch.distributed.tensor import DTensor

    out = {}
    for k, v in model.state_dict().items():
        out[k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
    return out


def assert_close(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str, tol: float = 1e-5
) -> None:
    assert a.keys() == b.keys(), f"{what}: keys differ {sorted(set(a) ^ set(b))}"
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=tol, atol=tol, msg=lambda m, k=k: f"{what} {k}: {m}")
