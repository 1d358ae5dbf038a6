"""A tiny training setup shared by the checkpoint unit tests (single process, CPU)."""

from __future__ import annotations

import torch

from accelerando import Accelerator, ProjectConfiguration
from accelerando.utils import set_seed


class Counter:
    """A user object registered for checkpointing."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class Net(torch.nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.inp, self.drop, self.out = torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 4)
        if tied:
            self.head = self.out  # the same module under two names: shared tensors in the state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(self.inp(x)))


class Setup:
    def __init__(self, project_config: ProjectConfiguration | None = None, tied: bool = False) -> None:
        set_seed(0)
        self.acc = Accelerator(cpu=True, project_config=project_config)
        model = Net(tied)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        self.counter = Counter()
        self.model, self.opt, self.sched = self.acc.prepare(model, opt, sched)
        self.acc.register_for_checkpointing(self.counter)

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            x = torch.randn(3, 4)
            loss = self.model(x).pow(2).mean()
            self.acc.backward(loss)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
            self.counter.value += 1

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]
