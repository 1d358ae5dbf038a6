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


class _WithNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.bn, self.b = torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.bn(self.a(x)))


def test_save_model_of_a_cpu_and_disk_offloaded_model_writes_the_real_weights(accelerator, tmp_path):
    from safetensors.torch import load_file

    from accelerando.big_modeling import dispatch_model

    torch.manual_seed(0)
    model = _WithNorm()
    model.bn.running_mean.fill_(0.5)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    offloaded = dispatch_model(
        model, device_map={"a": "cpu", "bn": "disk", "b": "disk"}, offload_dir=tmp_path / "off"
    )
    accelerator.save_model(offloaded, tmp_path / "out")
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert saved.keys() == reference.keys()
    assert all(torch.equal(saved[k], reference[k]) for k in reference)


def test_a_failed_save_model_leaves_no_staging_folder(accelerator, tmp_path, monkeypatch):
    from accelerando.checkpoint import state_dict as sd_io

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(sd_io, "write_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        accelerator.save_model(torch.nn.Linear(2, 2), tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_register_for_checkpointing_uses_accelerates_message_with_the_real_index(accelerator):
    with pytest.raises(
        ValueError, match=r"must include a `state_dict` and `load_state_dict`.*\n\t- Item at index 1, `int`"
    ):
        accelerator.register_for_checkpointing(torch.nn.Linear(1, 1), 3)


def test_honor_type_and_unsupported_types_match_accelerate():
    import collections

    from accelerate.utils import honor_type as theirs
    from accelerate.utils import recursively_apply as their_apply

    from accelerando.utils import honor_type, recursively_apply

    pair = collections.namedtuple("pair", "a b")(1, 2)
    for value in (pair, [1, 2], (1, 2)):
        assert honor_type(value, iter([3, 4])) == theirs(value, iter([3, 4]))

    def double(t):
        return t * 2

    for apply in (recursively_apply, their_apply):
        with pytest.raises(TypeError, match=r"^Unsupported types \(<class 'str'>\) passed to `double`"):
            apply(double, ["x"], error_on_other_type=True)


def test_local_sgd_is_a_no_op_on_one_process_and_validates_its_steps(accelerator):
    from accelerando.local_sgd import LocalSGD

    model = accelerator.prepare(torch.nn.Linear(2, 2))
    before = [p.clone() for p in model.parameters()]
    with LocalSGD(accelerator, model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="local_sgd_steps must be an integer >= 1, got 0"):
        LocalSGD(accelerator, model, local_sgd_steps=0)


@pytest.mark.parametrize("lib", ["accelerate", "accelerando"])
def test_gradient_state_reset_starts_accumulation_afresh_like_accelerate(lib):
    import importlib

    state = importlib.import_module(f"{lib}.state")
    plugin = importlib.import_module(f"{lib}.utils").GradientAccumulationPlugin(num_steps=4)
    first = state.GradientState(plugin)
    first._set_sync_gradients(False)
    assert (first.num_steps, first.sync_gradients) == (4, False)
    state.GradientState._reset_state()
    fresh = state.GradientState()
    assert (fresh.num_steps, fresh.sync_gradients, fresh.active_dataloader) == (1, True, None)
    assert fresh.initialized
