"""`Strategy.prepare(request)`: the composition order is code, and the request carries everything."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from accelerando import Accelerator
from accelerando.config.options import TorchDynamoPlugin
from accelerando.precision.base import Precision
from accelerando.strategies import Capabilities, PrepareRequest, strategy_class
from accelerando.strategies.single_device import SingleDeviceStrategy


class RecordingPrecision(Precision):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        self.log.append("precision")
        return model


class RecordingStrategy(SingleDeviceStrategy):
    log: list[str]

    def parallelize(self, model: torch.nn.Module) -> torch.nn.Module:
        self.log.append("parallelize")
        return model

    def checkpointed_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return [model[0]]

    def wrap_model(self, model: torch.nn.Module, *, evaluation_mode: bool = False) -> torch.nn.Module:
        self.log.append("wrap")
        return model


def test_composition_runs_in_the_documented_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8 conversion -> TP/CP -> activation checkpointing -> compile -> wrap (DESIGN principle 8)."""
    import accelerando.strategies.base as base

    log: list[str] = []
    acc = Accelerator(cpu=True)
    ctx = dataclasses.replace(acc.strategy.ctx, precision=RecordingPrecision(log))
    strategy = RecordingStrategy(ctx)
    strategy.log = log
    monkeypatch.setattr(
        base, "apply_activation_checkpointing", lambda mods: log.append(f"checkpoint {len(mods)}")
    )
    monkeypatch.setattr(
        base, "compile_model", lambda model, plugin: log.append(f"compile {plugin.backend}") or model
    )
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    request = PrepareRequest(models=[model], dynamo=TorchDynamoPlugin(backend="eager"))
    prepared = strategy.prepare(request)
    assert prepared.models == [model]
    assert log == ["precision", "parallelize", "checkpoint 1", "compile EAGER", "wrap"]


def test_prepare_hands_the_strategy_every_object_and_the_loaders_batch_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acc = Accelerator(cpu=True)
    seen: list[PrepareRequest] = []
    original = acc.strategy.prepare

    def spy(request: PrepareRequest) -> Any:
        seen.append(request)
        return original(request)

    monkeypatch.setattr(acc.strategy, "prepare", spy)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    data = torch.utils.data.TensorDataset(torch.randn(10, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    p_loader, p_model, p_opt, p_sched = acc.prepare(loader, model, opt, sched)
    (request,) = seen
    assert request.models == [model] and request.optimizers == [opt] and request.schedulers == [sched]
    assert request.batch_sizes == [4] and request.device_placement == [True]
    assert request.dynamo is acc.config.dynamo
    assert p_model is model and p_opt.optimizer is opt and p_sched.scheduler is sched
    assert acc._dataloaders == [p_loader] and acc._models == [model] and acc._schedulers == [p_sched]


def test_prepare_model_passes_evaluation_mode() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True)
    assert acc._models == [model]


def test_only_capabilities_something_reads_remain() -> None:
    """`owns_gradient_accumulation` is read by Accelerator.backward and AcceleratedOptimizer."""
    assert [f.name for f in dataclasses.fields(Capabilities)] == ["owns_gradient_accumulation"]
    for name in ("single_device", "ddp", "fsdp2"):
        assert strategy_class(name).capabilities == Capabilities()


def test_base_strategy_answers_what_the_facade_asks() -> None:
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    with acc.trigger_sync_in_backward(model), acc.join_uneven_inputs([model]), acc.no_sync(model):
        model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None
