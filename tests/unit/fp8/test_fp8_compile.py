"""Compiled fp8 training: torchao's Float8Linear under `torch.compile`, through accelerando and by hand.

Dynamo falls back to eager silently on what it cannot trace, and torchao's fp8 layers run on a tensor
subclass, so the test counts the captured graphs as well as comparing the numbers. `aot_eager`
traces forward and backward exactly as inductor would receive them, without the C++ build that
makes an inductor run cost ~20 s on this CPU (the GPU fp8 benchmark compiles with inductor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from accelerando import Accelerator, AORecipeKwargs
from accelerando.precision.fp8 import default_fp8_filter
from accelerando.utils import TorchDynamoPlugin

torchao_float8 = pytest.importorskip("torchao.float8")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))


def _train(model: Any, opt: Any, backward: Callable[[torch.Tensor], None], ctx: Any) -> list[float]:
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(4):
        x, y = torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)
        with ctx():
            loss = nn.functional.mse_loss(model(x), y)
        backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _graphs() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters["stats"])


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_compiled_fp8_training_equals_torchao_compiled_by_hand_and_captures_graphs(recipe: str) -> None:
    torch._dynamo.reset()
    acc = Accelerator(
        cpu=True,
        mixed_precision="fp8",
        kwargs_handlers=[AORecipeKwargs(recipe_name=recipe)],
        dynamo_plugin=TorchDynamoPlugin(backend="aot_eager"),
    )
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    ours = _train(model, opt, acc.backward, contextlib.nullcontext)
    ours_graphs = _graphs()
    layers = [type(m).__name__ for m in acc.unwrap_model(model).modules()]
    assert layers.count("Float8Linear") == 2  # converted before compile, not traced around

    torch._dynamo.reset()
    config = torchao_float8.Float8LinearConfig.from_recipe_name(recipe)
    by_hand = torchao_float8.convert_to_float8_training(
        _model(), config=config, module_filter_fn=default_fp8_filter
    )
    opt2 = torch.optim.AdamW(by_hand.parameters(), lr=1e-3)
    theirs = _train(
        torch.compile(by_hand, backend="aot_eager"),
        opt2,
        lambda loss: loss.backward(),
        lambda: torch.autocast("cpu", dtype=torch.bfloat16),  # torchao's recipe: fp8 under bf16 autocast
    )
    theirs_graphs = _graphs()

    assert ours == theirs
    for a, b in zip(acc.unwrap_model(model).state_dict().values(), by_hand.state_dict().values()):
        assert torch.equal(a, b)
    assert ours[-1] != ours[0]  # it trained
    for graphs in (ours_graphs, theirs_graphs):  # compiled for real: one graph, no eager fallback
        assert graphs.get("unique_graphs", 0) >= 1 and graphs.get("calls_captured", 0) > 0, graphs
