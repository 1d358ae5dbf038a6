"""fp8 training through torchao, for real on the CPU (torch._scaled_mm runs there)."""

import pytest
import torch

from accelerando import Accelerator, AORecipeKwargs

pytest.importorskip("torchao")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.Linear(32, 3)
    )


def test_fp8_converts_eligible_linears_and_trains():
    from torchao.float8.float8_linear import Float8Linear

    acc = Accelerator(cpu=True, mixed_precision="fp8")
    model, ref = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    kinds = [type(m) for m in model]
    assert (
        kinds[0] is Float8Linear and kinds[2] is Float8Linear and kinds[3] is torch.nn.Linear
    )  # 3 % 16 != 0
    x = torch.randn(64, 32)
    out, want = model(x), ref(x)
    assert ((out - want).norm() / want.norm()).item() < 0.1  # fp8 rounding, not a different function
    y = torch.randn(64, 3)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_fp8_recipe_needs_fp8_precision():
    with pytest.raises(ValueError, match="mixed_precision is 'bf16'"):
        Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[AORecipeKwargs()])


def test_fp8_recipe_filter_is_used():
    acc = Accelerator(
        cpu=True,
        mixed_precision="fp8",
        kwargs_handlers=[AORecipeKwargs(module_filter_func=lambda m, n: n == "2")],
    )
    model = acc.prepare(_model())
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Float8Linear", "Linear"]
