"""Small models shared by the big-model tests (a decoder-like stack with a tied head)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Toy(nn.Module):
    """Embedding -> blocks -> head; `tie=True` shares the embedding matrix with the head."""

    def __init__(self, vocab: int = 16, dim: int = 8, layers: int = 4, tie: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("scale", torch.tensor(0.5))
        self.register_buffer("table", torch.arange(dim, dtype=torch.float32), persistent=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.table
        for block in self.blocks:
            x = block(x)
        return self.head(x) * self.scale


def reference(seed: int = 0, **kwargs: object) -> Toy:
    torch.manual_seed(seed)
    return Toy(**kwargs).eval()  # type: ignore[arg-type]


def inputs(vocab: int = 16) -> torch.Tensor:
    return torch.arange(2 * 5).reshape(2, 5) % vocab
