"""Accelerate's DeepSpeed wrapper names, types and behaviour, on a real one-process DeepSpeed engine
(CPU, a private one-rank gloo group) against plain PyTorch on the same data."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

pytest.importorskip("deepspeed")

from accelerando import Accelerator  # noqa: E402
from accelerando.optimizer import AcceleratedOptimizer  # noqa: E402
from accelerando.scheduler import AcceleratedScheduler  # noqa: E402
from accelerando.utils import (  # noqa: E402
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedPlugin,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)

LR = 0.1
WRAPPERS = ("DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper")


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 4, generator=g), torch.randn(2, 1, generator=g)) for _ in range(n)]


def loss_of(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


def sgd_reference(batches: list[Any], accum: int = 1) -> list[torch.Tensor]:
    """Plain PyTorch: mean loss over each window of `accum` batches, one SGD step per window."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for i, batch in enumerate(batches):
        (loss_of(model, batch) / accum).backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def prepared(accum: int = 1, **plugin: Any) -> tuple[Accelerator, Any, Any]:
    acc = Accelerator(
        cpu=True,
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, **plugin),
        gradient_accumulation_steps=accum,
    )
    model = net()
    loader = torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=2)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR), loader)
    return acc, model, opt


def same(model: Any, want: list[torch.Tensor]) -> None:
    for got, ref in zip(model.module.parameters(), want):
        torch.testing.assert_close(got.detach(), ref, rtol=0, atol=1e-6)


def test_names_signatures_and_types_are_accelerates() -> None:
    import accelerate.utils
    import accelerate.utils.deepspeed

    import accelerando.utils.deepspeed

    for name in WRAPPERS:
        mine = getattr(accelerando.utils, name)
        assert mine is getattr(accelerando.utils.deepspeed, name)
        theirs = getattr(accelerate.utils.deepspeed, name)
        assert getattr(accelerate.utils, name) is theirs
        assert list(inspect.signature(mine).parameters) == list(inspect.signature(theirs).parameters), name
    assert issubclass(DeepSpeedOptimizerWrapper, AcceleratedOptimizer)
    assert issubclass(DeepSpeedSchedulerWrapper, AcceleratedScheduler)
    public = {"backward", "get_global_grad_norm"}
    assert public <= {n for n in dir(accelerate.utils.DeepSpeedEngineWrapper) if not n.startswith("_")}
    assert public <= {n for n in dir(DeepSpeedEngineWrapper) if not n.startswith("_")}


def test_prepare_returns_the_wrappers_and_the_loop_equals_pytorch() -> None:
    """What prepare returns: the engine, its optimizer in a DeepSpeedOptimizerWrapper, a
    config-defined scheduler in a DeepSpeedSchedulerWrapper; the loop of Accelerate's docs trains
    as plain SGD does; zero_grad and the scheduler's step leave the engine's work alone."""
    config = {
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,  # torch's SGD, built by DeepSpeed from this section
        "optimizer": {"type": "SGD", "params": {"lr": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": LR, "warmup_max_lr": LR,
                                                     "warmup_num_steps": 1, "warmup_type": "linear"}},
    }  # fmt: skip
    acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = net()
    opt = DummyOptim(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=2)
    model, opt, sched, _ = acc.prepare(model, opt, DummyScheduler(opt), loader)
    assert isinstance(opt, DeepSpeedOptimizerWrapper) and opt.optimizer is model.optimizer
    assert isinstance(sched, DeepSpeedSchedulerWrapper) and sched.scheduler is model.lr_scheduler
    assert sched.optimizers == [opt] and sched.get_last_lr() == [LR]
    batches = data(3)
    for batch in batches:
        acc.backward(loss_of(model, batch))
        opt.step()
        sched.step()
        opt.zero_grad()
        assert not opt.step_was_skipped
    assert model.global_steps == 3 and sched.scheduler.last_batch_iteration == 2  # the engine's steps only
    same(model, sgd_reference(batches))


def test_a_torch_optimizer_comes_back_wrapped_and_a_torch_scheduler_steps_as_usual() -> None:
    acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loader = torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=2)
    model, opt, sched, _ = acc.prepare(model, opt, sched, loader)
    assert isinstance(opt, DeepSpeedOptimizerWrapper)
    assert isinstance(opt.optimizer.optimizer, torch.optim.SGD)  # ZeRO's optimizer around the user's
    assert type(sched) is AcceleratedScheduler and sched.optimizers == [opt]
    acc.backward(loss_of(model, data(1)[0]))
    opt.step()
    sched.step()
    assert sched.get_last_lr() == [LR / 2] and opt.param_groups[0]["lr"] == LR / 2


def test_the_engine_wrapper_steps_at_the_boundary_as_accelerates_does() -> None:
    """DeepSpeedEngineWrapper.backward: no step mid-window, the engine's step at its end; a later
    optimizer.step() of the same window does not step again."""
    acc, model, opt = prepared(accum=2)
    wrapper = acc.strategy.engine_wrapper(model)
    assert isinstance(wrapper, DeepSpeedEngineWrapper) and wrapper.engine is model
    assert acc.strategy.engine_wrapper(model.module).engine is model
    batches = data(2)
    before = [p.detach().clone() for p in model.module.parameters()]
    wrapper.backward(loss_of(model, batches[0]) / 2, sync_gradients=False, scale_wrt_gas=False)
    same(model, before)
    wrapper.backward(loss_of(model, batches[1]) / 2, sync_gradients=True, scale_wrt_gas=False)
    assert model.global_steps == 1 and wrapper.get_global_grad_norm() > 0
    opt.step()
    assert model.global_steps == 1
    same(model, sgd_reference(batches, accum=2))


@pytest.mark.parametrize("scale_wrt_gas", [None, True, False])
def test_backward_passes_scale_wrt_gas_through_as_accelerate_does(scale_wrt_gas: bool | None) -> None:
    """transformers' Trainer divides the loss itself and passes scale_wrt_gas=False; the default
    (or True) lets the loop divide it. Either way the loss is divided once per window."""
    acc, model, opt = prepared(accum=2)
    batches = data(4)
    for batch in batches:
        with acc.accumulate(model):
            loss = loss_of(model, batch)
            if scale_wrt_gas is None:
                acc.backward(loss)
            elif scale_wrt_gas:
                acc.backward(loss, scale_wrt_gas=True)
            else:
                acc.backward(loss / 2, scale_wrt_gas=False)
            opt.step()
            opt.zero_grad()
    assert model.global_steps == 2
    same(model, sgd_reference(batches, accum=2))


def test_deepspeed_engine_wrapped_is_the_first_engine_prepared_as_in_accelerate() -> None:
    """None before prepare; the first engine afterwards, kept when a second (inference) engine is
    prepared; None after free_memory. Without DeepSpeed the attribute is absent, as in Accelerate."""
    plugins = {"student": DeepSpeedPlugin(zero_stage=2), "teacher": DeepSpeedPlugin(zero_stage=3)}
    acc = Accelerator(cpu=True, deepspeed_plugins=plugins)
    assert acc.deepspeed_engine_wrapped is None
    model = net()
    loader = torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=2)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR), loader)
    wrapped = acc.deepspeed_engine_wrapped
    assert isinstance(wrapped, DeepSpeedEngineWrapper) and wrapped.engine is model
    acc.state.select_deepspeed_plugin("teacher")
    frozen = acc.prepare(net().requires_grad_(False))
    acc.state.select_deepspeed_plugin("student")
    assert acc.deepspeed_engine_wrapped is wrapped and frozen is not model
    batches = data(1)
    wrapped.backward(loss_of(model, batches[0]))  # Accelerate's loop through the attribute
    assert model.global_steps == 1
    same(model, sgd_reference(batches))
    acc.free_memory()
    assert acc.deepspeed_engine_wrapped is None


def test_without_deepspeed_there_is_no_deepspeed_engine_wrapped() -> None:
    assert not hasattr(Accelerator(cpu=True), "deepspeed_engine_wrapped")


def test_map_pytorch_optim_to_deepspeed_picks_deepspeeds_cpu_optimizer() -> None:
    """The class and keywords of Accelerate's mapping (checked without building the JIT-compiled op);
    an optimizer with no CPU equivalent is refused with the accepted ones named."""
    import accelerate.utils
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from accelerando.utils import map_pytorch_optim_to_deepspeed
    from accelerando.utils.deepspeed import deepspeed_cpu_optimizer_class

    assert list(inspect.signature(map_pytorch_optim_to_deepspeed).parameters) == list(
        inspect.signature(accelerate.utils.map_pytorch_optim_to_deepspeed).parameters
    )
    params = list(net().parameters())
    pick = deepspeed_cpu_optimizer_class
    assert pick(torch.optim.AdamW(params, lr=0.3, weight_decay=0.2)) == (
        DeepSpeedCPUAdam,
        {"lr": 0.3, "weight_decay": 0.2, "adamw_mode": True},
    )
    assert pick(torch.optim.Adam(params, lr=0.3)) == (
        DeepSpeedCPUAdam,
        {"lr": 0.3, "weight_decay": 0, "adamw_mode": False},
    )
    assert pick(torch.optim.Adagrad(params, lr=0.3)) == (DeepSpeedCPUAdagrad, {"lr": 0.3, "weight_decay": 0})
    with pytest.raises(ValueError, match=r"torch\.optim\.sgd\.SGD has no DeepSpeed CPU optimizer.*AdamW"):
        pick(torch.optim.SGD(params, lr=0.1))
    with pytest.raises(ValueError, match="no amsgrad; AdamW uses it"):
        pick(torch.optim.AdamW(params, amsgrad=True))
    with pytest.raises(ValueError, match="no lr_decay; Adagrad uses it"):
        pick(torch.optim.Adagrad(params, lr_decay=0.1))
    # Adam with decoupled weight decay is AdamW's update (Accelerate would pick adamw_mode=False).
    assert pick(torch.optim.Adam(params, decoupled_weight_decay=True))[1]["adamw_mode"] is True
    # bitsandbytes (not installed here): the class name, module and optim_bits decide, as in Accelerate.
    bnb = {name: type(name, (torch.optim.SGD,), {"__module__": "bitsandbytes.optim.x"}) for name in
           ("Adam32bit", "AdamW32bit", "AdamW8bit")}  # fmt: skip
    for name, mode in (("Adam32bit", False), ("AdamW32bit", True)):
        optimizer = bnb[name](params, lr=0.3)
        optimizer.optim_bits = 32
        assert pick(optimizer) == (DeepSpeedCPUAdam, {"lr": 0.3, "weight_decay": 0, "adamw_mode": mode})
    eight_bit = bnb["AdamW8bit"](params, lr=0.3)
    eight_bit.optim_bits = 8
    with pytest.raises(ValueError, match="AdamW8bit has no DeepSpeed CPU optimizer"):
        pick(eight_bit)


def test_forcing_deepspeeds_cpu_optimizer_refuses_one_without_equivalent_before_any_engine() -> None:
    """ZeRO-Offload keeps the torch optimizer unless the config forces DeepSpeed's CPU optimizer;
    forced, an SGD (which Accelerate would silently turn into Adam) stops prepare."""
    from accelerando.strategies.deepspeed_config import EngineRequest, engine_config, optimizer_for_engine

    model = net()
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    kept = DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu")
    config = engine_config(kept, EngineRequest(model, sgd), batch_sizes=[2], accumulation=1, world_size=1)
    assert config["zero_force_ds_cpu_optimizer"] is False and optimizer_for_engine(sgd, config) is sgd
    forced = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                      "zero_force_ds_cpu_optimizer": True}
    )  # fmt: skip
    with pytest.raises(ValueError, match="SGD has no DeepSpeed CPU optimizer"):
        engine_config(forced, EngineRequest(model, sgd), batch_sizes=[2], accumulation=1, world_size=1)
    # Forced: a torch optimizer is mapped, one of DeepSpeed's own passes unchanged (not rebuilt as Adam).
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from accelerando.strategies.deepspeed_config import _needs_cpu_optimizer

    config = engine_config(forced, EngineRequest(model, None), batch_sizes=[2], accumulation=1, world_size=1)
    assert _needs_cpu_optimizer(torch.optim.AdamW(model.parameters()), config)
    unbuilt = DeepSpeedCPUAdam.__new__(DeepSpeedCPUAdam)  # its type is all that counts; no op is built
    assert not _needs_cpu_optimizer(unbuilt, config) and optimizer_for_engine(unbuilt, config) is unbuilt


def test_map_pytorch_optim_to_deepspeed_builds_what_accelerates_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both mappings run with DeepSpeed's CPU optimizer classes replaced by subclasses that record
    their arguments instead of JIT-compiling the op: same class, same parameter groups, same keywords
    for torch Adam and AdamW; Adagrad gets the same class (Accelerate also passes `adamw_mode`, which
    DeepSpeedCPUAdagrad does not take)."""
    import accelerate.utils
    import deepspeed.ops.adagrad
    import deepspeed.ops.adam

    from accelerando.utils import map_pytorch_optim_to_deepspeed

    def recording(cls: type) -> type:
        def init(self: Any, params: Any, **kwargs: Any) -> None:
            self.groups, self.kwargs = params, kwargs

        return type(cls.__name__, (cls,), {"__init__": init})

    for module, name in (
        (deepspeed.ops.adam, "DeepSpeedCPUAdam"),
        (deepspeed.ops.adagrad, "DeepSpeedCPUAdagrad"),
    ):
        monkeypatch.setattr(module, name, recording(getattr(module, name)))
    model = net()
    groups = [{"params": [model[0].weight], "lr": 0.5}, {"params": list(model[2].parameters())}]
    for make in (torch.optim.AdamW, torch.optim.Adam):
        theirs = accelerate.utils.map_pytorch_optim_to_deepspeed(make(groups, lr=0.3, weight_decay=0.1))
        mine = map_pytorch_optim_to_deepspeed(make(groups, lr=0.3, weight_decay=0.1))
        assert type(mine) is type(theirs) is deepspeed.ops.adam.DeepSpeedCPUAdam
        assert (
            mine.kwargs
            == theirs.kwargs
            == {"lr": 0.3, "weight_decay": 0.1, "adamw_mode": make is torch.optim.AdamW}
        )
        assert [g["lr"] for g in mine.groups] == [g["lr"] for g in theirs.groups] == [0.5, 0.3]
        assert [g["params"] for g in mine.groups] == [g["params"] for g in theirs.groups]
    theirs = accelerate.utils.map_pytorch_optim_to_deepspeed(torch.optim.Adagrad(model.parameters(), lr=0.3))
    mine = map_pytorch_optim_to_deepspeed(torch.optim.Adagrad(model.parameters(), lr=0.3))
    assert type(mine) is type(theirs) is deepspeed.ops.adagrad.DeepSpeedCPUAdagrad
    assert mine.kwargs == {"lr": 0.3, "weight_decay": 0} and theirs.kwargs == {
        **mine.kwargs,
        "adamw_mode": False,
    }


def test_a_later_plain_accelerator_joins_the_running_deepspeed_strategy() -> None:
    """Accelerate's multi-model recipe: `Accelerator()` after one with DeepSpeed plugins shares its
    state; the selected plugin builds the next engine, and the first engine stays reachable."""
    student_plugin = DeepSpeedPlugin(zero_stage=2)
    teacher_plugin = DeepSpeedPlugin(zero_stage=3)
    first = Accelerator(cpu=True, deepspeed_plugins={"student": student_plugin, "teacher": teacher_plugin})
    loader = torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=2)
    model = net()
    student, opt, _ = first.prepare(model, torch.optim.SGD(model.parameters(), lr=LR), loader)
    first.state.select_deepspeed_plugin("teacher")
    second = Accelerator()
    assert second.distributed_type == "DEEPSPEED" and second.state.deepspeed_plugin is teacher_plugin
    teacher = second.prepare(net())
    assert teacher.zero_optimization_stage() == 3 and student.zero_optimization_stage() == 2
    batches = data(2)
    for batch in batches:  # the first Accelerator still drives its own engine
        first.backward(loss_of(student, batch))
        opt.step()
        opt.zero_grad()
    same(student, sgd_reference(batches))
