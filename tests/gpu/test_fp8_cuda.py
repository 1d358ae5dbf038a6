"""fp8 on a real GPU (run on the GPU machine: `pytest -m cuda tests/gpu`): torchao's fp8 GEMMs and
Transformer Engine, each trained through accelerando against the same steps written by hand with the
backend's own API. Each skips, saying why, where its package does not import or the GPU has no fp8
tensor cores (compute capability < 8.9)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando import Accelerator, AORecipeKwargs, TERecipeKwargs
from accelerando.precision.fp8 import default_fp8_filter
from accelerando.state import reset_runtime

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
        reason="fp8 GEMMs need compute capability >= 8.9",
    ),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.LayerNorm(512), torch.nn.GELU(), torch.nn.Linear(512, 256)
    )


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(1)
    return [
        (torch.randn(64, 256, device="cuda", generator=g), torch.randn(64, 256, device="cuda", generator=g))
        for _ in range(20)
    ]


def _train(model: Any, opt: Any, backward: Any, ctx: Any) -> list[float]:
    losses = []
    for x, y in _batches():
        with ctx():
            loss = torch.nn.functional.mse_loss(model(x), y)
        backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@contextlib.contextmanager
def _bf16_fp8(te: Any, recipe: Any) -> Any:
    """TE by hand as Accelerate runs it: bf16 autocast around fp8_autocast."""
    with torch.autocast("cuda", dtype=torch.bfloat16), te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        yield


def _through_accelerando(handler: Any) -> tuple[list[float], torch.nn.Module, Accelerator]:
    reset_runtime()
    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[handler])
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    return _train(model, opt, acc.backward, contextlib.nullcontext), model, acc


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_fp8_gemms_train_like_torchao_by_hand(recipe: str, tmp_path: Path) -> None:
    pytest.importorskip("torchao.float8", reason="torchao is not installed on this machine")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    ours, model, acc = _through_accelerando(AORecipeKwargs(recipe_name=recipe))
    ref = convert_to_float8_training(
        _model(), config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=default_fp8_filter
    ).cuda()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    theirs = _train(
        ref, ref_opt, lambda loss: loss.backward(), lambda: torch.autocast("cuda", torch.bfloat16)
    )
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert ours[-1] < ours[0]
    acc.save_model(model, str(tmp_path))
    from safetensors.torch import load_file

    _model().load_state_dict(load_file(str(tmp_path / "model.safetensors")))  # strict, into the plain model


def test_transformer_engine_trains_like_te_by_hand_and_its_checkpoint_loads(tmp_path: Path) -> None:
    te = pytest.importorskip("transformer_engine.pytorch", reason="Transformer Engine is not installed here")
    from transformer_engine.common.recipe import DelayedScaling, Format

    ours, model, acc = _through_accelerando(TERecipeKwargs())
    assert any(isinstance(m, te.Linear) for m in model.modules())
    ref = _model().cuda()
    for name in ("0", "3"):
        old = getattr(ref, name)
        new = te.Linear(old.in_features, old.out_features, params_dtype=old.weight.dtype).cuda()
        with torch.no_grad():
            new.weight.copy_(old.weight)
            new.bias.copy_(old.bias)
        setattr(ref, name, new)
    norm = te.LayerNorm(512, eps=ref[1].eps).cuda()
    with torch.no_grad():
        norm.weight.copy_(ref[1].weight)
        norm.bias.copy_(ref[1].bias)
    ref[1] = norm
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=1024, amax_compute_algo="most_recent")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    theirs = _train(ref, ref_opt, lambda loss: loss.backward(), lambda: _bf16_fp8(te, recipe))
    assert ours == pytest.approx(theirs, rel=1e-4)
    assert model.state_dict()["0._extra_state"].numel() > 0  # TE's fp8 scaling state
    acc.save_state(str(tmp_path / "state"))
    reset_runtime()
    fresh_acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    fresh = _model()
    fresh, _ = fresh_acc.prepare(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3))
    fresh_acc.load_state(str(tmp_path / "state"))  # strict, _extra_state included
    torch.testing.assert_close(fresh[0].weight, model[0].weight)
