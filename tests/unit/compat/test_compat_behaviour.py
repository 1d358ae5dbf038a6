"""Behaviours Accelerate users rely on, compared with the installed `accelerate` where they are pure."""

from __future__ import annotations

import pytest
import torch

from accelerando import Accelerator
from accelerando.utils import extract_model_from_parallel


@pytest.fixture
def accelerator():
    return Accelerator(cpu=True)


def test_prepared_objects_carry_accelerates_marker(accelerator):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    loader = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=2)
    for obj in accelerator.prepare(model, opt, sched, loader):
        assert obj._is_accelerate_prepared is True


def test_preparing_twice_returns_the_same_objects_registered_once(accelerator):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    loader = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=2)
    first = accelerator.prepare(model, opt, sched, loader)
    second = accelerator.prepare(*first)
    assert all(a is b for a, b in zip(first, second))
    assert accelerator.prepare_model(first[0]) is first[0]
    assert accelerator.prepare_optimizer(first[1]) is first[1]
    assert accelerator.prepare_scheduler(first[2]) is first[2]
    assert accelerator.prepare_data_loader(first[3]) is first[3]
    counts = [len(r) for r in (accelerator._models, accelerator._optimizers, accelerator._schedulers)]
    assert counts + [len(accelerator._dataloaders)] == [1, 1, 1, 1]


@pytest.mark.parametrize("keep_torch_compile", [True, False])
def test_dataparallel_inside_a_compiled_model_is_stripped_like_accelerate(keep_torch_compile):
    from accelerate.utils import extract_model_from_parallel as theirs

    for unwrap in (extract_model_from_parallel, theirs):
        model = torch.nn.Linear(2, 2)
        out = unwrap(torch.compile(torch.nn.DataParallel(model)), keep_torch_compile=keep_torch_compile)
        if keep_torch_compile:
            assert type(out).__name__ == "OptimizedModule" and out._orig_mod is model
        else:
            assert out is model


def test_unwrap_model_strips_dataparallel_inside_compile(accelerator):
    model = torch.nn.Linear(2, 2)
    assert (
        accelerator.unwrap_model(torch.compile(torch.nn.DataParallel(model)), keep_torch_compile=False)
        is model
    )


def test_recursive_unwrap_strips_wrapped_children():
    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(torch.nn.DataParallel(inner))
    assert extract_model_from_parallel(outer, recursive=True)[0] is inner


def test_a_reset_state_object_raises_accelerates_hint_until_reinitialised():
    from accelerando.state import AcceleratorState, PartialState

    state = PartialState(cpu=True)
    PartialState._reset_state()
    with pytest.raises(
        AttributeError, match=r"`PartialState` object has no attribute `device`.*_reset_state\(\)"
    ):
        _ = state.device
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'no_such_thing'"):
        _ = state.no_such_thing
    PartialState(cpu=True)
    assert state.device.type == "cpu"  # every instance views the one runtime again
    acc_state = AcceleratorState(cpu=True)
    AcceleratorState._reset_state(True)
    with pytest.raises(AttributeError, match="`AcceleratorState` object has no attribute `mixed_precision`"):
        _ = acc_state.mixed_precision


def test_debug_mode_can_be_switched_on_like_accelerate():
    from accelerando.state import PartialState

    state = PartialState(cpu=True)
    state.debug = True
    assert PartialState().debug is True
    state.debug = False
    assert PartialState().debug is False
