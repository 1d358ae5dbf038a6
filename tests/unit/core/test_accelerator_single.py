"""Single-process behaviour of the facade, each compared with plain PyTorch."""

import copy

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator, GradientAccumulationPlugin, GradScalerKwargs
from accelerando.state import AcceleratorState, GradientState, PartialState
from accelerando.utils import set_seed, tqdm


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()


def _data(n=20):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )


def test_accumulation_with_partial_last_window_equals_full_batches():
    x, y = _data(20)
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    # 5 micro-batches of 4 with accumulation 2: windows of 2, 2 and a last partial one of 1.
    for lo, hi in [(0, 8), (8, 16), (16, 20)]:
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x[lo:hi]), y[lo:hi]).backward()
        ref_opt.step()

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    loader = acc.prepare(DataLoader(TensorDataset(x, y), batch_size=4))
    syncs = []
    for xb, yb in loader:
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
            syncs.append(acc.sync_gradients)
            opt.step()
            opt.zero_grad()
    assert syncs == [False, True, False, True, True]
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-12, rtol=0)


def test_accumulation_without_loader_counts_steps():
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3))
    model = acc.prepare(_model())
    flags = []
    for _ in range(6):
        with acc.accumulate(model):
            flags.append(acc.sync_gradients)
    assert flags == [False, False, True] * 2
    assert GradientState().num_steps == 3


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_autocasts_on_cpu(precision, dtype):
    # A small initial scale: 65536 overflows fp16 gradients of this layer on the very first step.
    acc = Accelerator(
        cpu=True, mixed_precision=precision, kwargs_handlers=[GradScalerKwargs(init_scale=256.0)]
    )
    seen = {}
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model[0].register_forward_hook(lambda m, i, o: seen.update(dtype=o.dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    out = model(torch.randn(2, 4))
    assert seen["dtype"] == dtype and out.dtype == torch.float32  # outputs come back in fp32
    with acc.autocast():
        assert torch.nn.functional.linear(torch.randn(2, 4), torch.randn(4, 4)).dtype == dtype
    before = model[0].weight.detach().clone()
    acc.backward(out.sum())
    opt.step()
    assert not torch.equal(before, model[0].weight)
    assert (acc.scaler is not None) == (precision == "fp16")
    assert not acc.optimizer_step_was_skipped
    assert acc.unwrap_model(model, keep_fp32_wrapper=False)(torch.randn(2, 4)).dtype == torch.float32


def test_fp16_overflow_skips_step_and_backs_off():
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    before = model.weight.detach().clone()
    acc.backward(model(torch.randn(1, 2)).sum() * float("inf"))
    opt.step()
    assert acc.optimizer_step_was_skipped and torch.equal(before, model.weight)
    assert acc.scaler.get_scale() == 32768.0


def test_clip_grad_norm_matches_torch():
    acc = Accelerator(cpu=True)
    model, ref = _model(), _model()
    model = acc.prepare(model)
    x, y = _data(8)
    torch.nn.functional.mse_loss(model(x), y).backward()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    got = acc.clip_grad_norm_(model.parameters(), 0.01)
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01)
    assert torch.allclose(got, want)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad)
    acc.clip_grad_value_(model.parameters(), 1e-4)
    assert max(p.grad.abs().max() for p in model.parameters()) <= 1e-4


def test_prepare_keeps_order_and_passes_other_objects_through():
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    marker = object()
    out = acc.prepare(sched, marker, opt, model)
    assert out[1] is marker and out[3] is model
    assert out[2].optimizer is opt and out[0].scheduler is sched
    with pytest.raises(ValueError, match="device_placement has 1 entries for 2"):
        acc.prepare(model, opt, device_placement=[True])


def test_state_views_share_one_runtime():
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    assert PartialState().device == acc.device == torch.device("cpu")
    assert AcceleratorState().mixed_precision == "bf16"
    assert PartialState().num_processes == 1 and PartialState().is_main_process
    with PartialState().split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]


def test_split_between_processes_math():
    from accelerando.state import _split

    parts = [_split(list(range(7)), 3, r, False) for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]
    assert _split(list(range(7)), 3, 2, True) == [5, 6, 6]
    assert _split({"a": [1, 2], "b": [3, 4]}, 2, 1, False) == {"a": [2], "b": [4]}
    assert torch.equal(_split(torch.arange(5), 2, 1, True), torch.tensor([3, 4, 4]))


def test_decorators_and_triggers():
    acc = Accelerator(cpu=True)
    assert acc.on_main_process(lambda: 1)() == 1
    assert acc.on_process(lambda: 2, process_index=1)() is None
    assert acc.check_trigger() is False
    acc.set_trigger()
    assert acc.check_trigger() is True and acc.check_trigger() is False


def test_tqdm_refuses_positional_bool():
    PartialState(cpu=True)
    with pytest.raises(TypeError, match="main_process_only is keyword-only"):
        tqdm(True, range(3))
    assert list(tqdm(range(3), main_process_only=True, disable=True)) == [0, 1, 2]


def test_set_seed_is_reproducible():
    set_seed(5)
    a = torch.rand(3)
    set_seed(5)
    assert torch.equal(a, torch.rand(3))


def test_logger_needs_state_and_logs_once(caplog):
    from accelerando.logging import get_logger

    logger = get_logger("accelerando.test", log_level="INFO")
    with pytest.raises(RuntimeError, match="PartialState"):
        logger.info("too early")
    PartialState(cpu=True)
    with caplog.at_level("INFO"):
        logger.info("hello", main_process_only=True)
    assert "hello" in caplog.text


def test_free_memory_resets_lists():
    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(2, 2))
    acc.free_memory()
    assert acc._models == [] and acc.step == 0


def test_compile_in_place_keeps_state_dict_keys():
    acc = Accelerator(cpu=True, dynamo_backend="eager")
    model = torch.nn.Linear(3, 3)
    keys = list(copy.deepcopy(model).state_dict())
    model = acc.prepare(model)
    assert list(model.state_dict()) == keys
    assert torch.allclose(
        model(torch.ones(1, 3)), torch.nn.functional.linear(torch.ones(1, 3), model.weight, model.bias)
    )


def test_rich_tracebacks_are_opt_in():
    import os
    import subprocess
    import sys

    code = "import sys, accelerando; print(sys.excepthook.__module__)"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    env = {**os.environ, "ACCELERATE_ENABLE_RICH": "1"}
    rich = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "rich" not in plain and "rich" in rich


def test_profile_writes_a_trace(tmp_path):
    import json

    from accelerando import ProfileKwargs

    acc = Accelerator(
        cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path), record_shapes=True)]
    )
    with acc.profile() as prof:
        torch.nn.functional.linear(torch.randn(8, 8), torch.randn(8, 8))
    assert any("linear" in e.key for e in prof.key_averages())
    trace = json.loads((tmp_path / "profile_0.json").read_text())
    assert trace["traceEvents"]
    with pytest.raises(ValueError, match="activity 'gpu'"):
        with acc.profile(ProfileKwargs(activities=["gpu"])):
            pass
