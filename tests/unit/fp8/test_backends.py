"""Transformer Engine and MS-AMP through accelerando, against recorded fakes of their APIs (neither
installs without CUDA; see fp8_sdk_fakes.py), compared step for step with the same training by hand;
torchao for real: recipes, and weights that load into the plain model."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fp8_sdk_fakes import install_msamp, install_transformer_engine

from accelerando import Accelerator, AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from accelerando.precision import registry
from accelerando.precision.fp8_probe import Fp8Facts


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
        torch.nn.Linear(32, 3),
    )  # fmt: skip


def _batches(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 3, generator=g)) for _ in range(n)]


def _every_backend_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's facts of an H100 with all three packages: the code paths run on this CPU."""
    facts = Fp8Facts("cuda", (9, 0), frozenset({"ao", "te", "msamp"}))
    monkeypatch.setattr(registry, "gather_facts", lambda device_type, backends: facts)


def _bf16() -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16)  # Accelerate runs every fp8 forward under it


def _train(
    model: Any, opt: Any, step: Any, acc: Accelerator | None = None, sched: Any = None, ctx: Any = None
) -> list[float]:
    losses = []
    for x, y in _batches():
        with ctx() if ctx is not None else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss) if acc is not None else loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_te_converts_once_before_wrapping_runs_forward_under_fp8_autocast_and_matches_by_hand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = install_transformer_engine(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    te = sys.modules["transformer_engine.pytorch"]
    fmt = sys.modules["transformer_engine.common.recipe"].Format
    acc = Accelerator(
        cpu=True,
        mixed_precision="fp8",
        kwargs_handlers=[TERecipeKwargs(margin=2, fp8_format="e4m3", amax_history_len=16)],
    )
    model, ref = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    assert [type(m) for m in model] == [te.Linear, te.LayerNorm, torch.nn.ReLU, te.Linear, torch.nn.Linear]
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}
    assert acc.prepare_model(model) is model and type(model[0]) is te.Linear  # never converted twice

    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    by_hand = []
    for x, y in _batches():  # the same steps written by hand with the SDK
        with _bf16(), te.fp8_autocast(enabled=True, fp8_recipe=None):
            loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        by_hand.append(loss.item())
    calls.autocast.clear()
    calls.fp8_forwards = 0
    assert _train(model, opt, None, acc) == pytest.approx(by_hand, rel=1e-6)
    ours = {k: v for k, v in model.state_dict().items() if not k.endswith("._extra_state")}
    torch.testing.assert_close(ours, ref.state_dict())
    assert calls.fp8_forwards == 2 * 3  # both te.Linear layers, every step, inside fp8_autocast
    enabled, recipe = calls.autocast[-1]
    assert enabled and (recipe.margin, recipe.fp8_format, recipe.amax_history_len) == (2, fmt.E4M3, 16)
    assert (recipe.amax_compute_algo, recipe.override_linear_precision) == (
        "most_recent",
        (False, False, False),
    )
    model.eval()
    model(torch.randn(2, 32))
    assert calls.autocast[-1][0] is False  # evaluation runs without fp8 unless use_autocast_during_eval


def test_te_under_deepspeed_trains_the_converted_layers_as_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 ZeRO-2 engine around the TE layers: the optimizer follows the swapped parameters."""
    deepspeed = pytest.importorskip("deepspeed")
    from accelerando.utils import DeepSpeedPlugin

    calls = install_transformer_engine(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    te = sys.modules["transformer_engine.pytorch"]
    config = {
        "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
    }  # fmt: skip
    acc = Accelerator(
        cpu=True,
        mixed_precision="fp8",
        kwargs_handlers=[TERecipeKwargs()],
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=dict(config)),
    )
    model = _model()
    engine, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    module = acc.unwrap_model(engine)
    assert [type(m) for m in module] == [te.Linear, te.LayerNorm, torch.nn.ReLU, te.Linear, torch.nn.Linear]
    calls.fp8_forwards = 0
    ours = _train(engine, opt, None, acc)
    assert calls.fp8_forwards == 2 * 3  # both te.Linear layers, every step, inside fp8_autocast

    ref = _model()
    from accelerando.precision.fp8_te import convert_to_te

    convert_to_te(ref, te)
    hand, *_ = deepspeed.initialize(
        model=ref,
        optimizer=torch.optim.SGD(ref.parameters(), lr=0.1),
        config=dict(config),
        dist_init_required=False,
    )
    by_hand = []
    for x, y in _batches():
        with _bf16(), te.fp8_autocast(enabled=True, fp8_recipe=None):
            out = hand(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        hand.backward(loss)
        hand.step()
        by_hand.append(loss.item())
    assert ours == by_hand
    for a, b in zip(module.parameters(), hand.module.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(module[0].weight, _model()[0].weight.to(module[0].weight.dtype))  # it trained


def test_te_checkpoints_carry_extra_state_and_load_strictly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """TE modules keep their fp8 scaling state in `_extra_state` (a uint8 tensor whose length changes as
    it trains): save_state / load_state restore it into a fresh converted model under strict loading,
    and save_model's weights load strictly into the plain model (which has no such keys)."""
    install_transformer_engine(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    acc = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    _train(model, opt, None, acc)
    saved = model.state_dict()
    assert saved["0._extra_state"].numel() > 0 and saved["1._extra_state"].numel() == 0
    acc.save_state(str(tmp_path / "state"), safe_serialization=True)
    acc.save_model(model, str(tmp_path / "weights"))

    fresh_acc = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    fresh = _model()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    fresh, fresh_opt = fresh_acc.prepare(fresh, fresh_opt)
    assert fresh.state_dict()["0._extra_state"].numel() == 0  # never ran under fp8: TE's empty state
    fresh_acc.load_state(str(tmp_path / "state"))  # strict
    assert fresh[0].amax_history == model[0].amax_history and fresh[3].amax_history == model[3].amax_history
    torch.testing.assert_close(fresh.state_dict(), saved)

    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "weights" / "model.safetensors"))
    assert not any(k.endswith("_extra_state") for k in weights)
    plain = _model()
    plain.load_state_dict(weights)  # strict
    torch.testing.assert_close(plain[0].weight, model[0].weight)


def test_te_recipe_fields_the_installed_te_lacks_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    install_transformer_engine(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    with pytest.raises(
        ValueError, match="interval=4: this Transformer Engine's DelayedScaling has no `interval`"
    ):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(interval=4)])


def test_fp8_recipe_kwargs_alias_reaches_the_te_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.utils import FP8RecipeKwargs

    install_transformer_engine(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    with pytest.warns(FutureWarning):
        handler = FP8RecipeKwargs(backend="te", margin=1)
    acc = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[handler])
    assert acc.precision.backend == "te" and acc.precision.fp8_recipe.margin == 1


def test_msamp_initializes_model_and_optimizer_together_and_matches_by_hand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = install_msamp(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    msamp = sys.modules["msamp"]
    acc = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs(opt_level="o1")])
    model, ref = _model(), _model()
    original = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(original, 1, gamma=0.5)
    model, opt, sched = acc.prepare(model, original, sched)
    assert [(m is not None, o is original, level) for m, o, level in calls.initialize] == [(True, True, "O1")]
    assert type(model[0]) is msamp.FP8Linear and opt.optimizer is not original
    assert sched.scheduler.optimizer is opt.optimizer  # the scheduler drives MS-AMP's optimizer

    ref_model, ref_opt = msamp.initialize(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), opt_level="O1")
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5)
    by_hand = _train(ref_model, ref_opt, None, None, ref_sched, ctx=_bf16)
    assert _train(model, opt, None, acc, sched) == pytest.approx(by_hand, rel=1e-6)
    for ours, theirs in zip(model.state_dict().values(), ref_model.state_dict().values()):
        torch.testing.assert_close(ours, theirs)
    with pytest.raises(
        ValueError, match=r"pass exactly one model and one optimizer .*\(got 1 model\(s\) and 0"
    ):
        acc.prepare(_model())


def test_msamp_refuses_fsdp2_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando import FullyShardedDataParallelPlugin

    install_msamp(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    with pytest.raises(
        ValueError, match=r"fp8 backend 'msamp' does not support the FSDP2 \(fully_shard\) strategy"
    ):
        Accelerator(
            cpu=True,
            mixed_precision="fp8",
            kwargs_handlers=[MSAMPRecipeKwargs()],
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        )


def test_msamp_refuses_deepspeed_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("deepspeed")
    from accelerando.utils import DeepSpeedPlugin

    install_msamp(monkeypatch)
    _every_backend_runs_here(monkeypatch)
    with pytest.raises(ValueError, match=r"fp8 backend 'msamp' does not support the DeepSpeed strategy"):
        Accelerator(
            cpu=True,
            mixed_precision="fp8",
            kwargs_handlers=[MSAMPRecipeKwargs()],
            deepspeed_plugin=DeepSpeedPlugin(zero_stage=2),
        )


# ---- torchao, for real ------------------------------------------------------------------------


def test_torchao_is_chosen_here_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("torchao")
    with caplog.at_level("INFO", logger="accelerando.precision"):
        acc = Accelerator(cpu=True, mixed_precision="fp8")
    assert acc.precision.backend == "ao"
    assert any("fp8: chose backend 'ao' (torchao) on cpu" in r.getMessage() for r in caplog.records)


def test_torchao_recipe_names_and_switches_build_the_config() -> None:
    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig

    acc = Accelerator(
        cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(recipe_name="RowWise")]
    )
    assert acc.precision.config == Float8LinearConfig.from_recipe_name("rowwise")
    with pytest.raises(ValueError, match="`recipe_name` must be one of tensorwise or rowwise"):
        AORecipeKwargs(recipe_name="blockwise")


def test_torchao_unwrap_and_save_model_give_weights_that_load_into_the_plain_model(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    from safetensors.torch import load_file

    acc = Accelerator(cpu=True, mixed_precision="fp8")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    seen = []
    model[2].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    assert model(torch.randn(4, 32)).dtype == torch.float32  # outputs in fp32, as Accelerate returns them
    assert seen == [torch.bfloat16]  # the rest of the forward under bf16 autocast, as in Accelerate
    _train(model, opt, None, acc)
    acc.save_model(model, str(tmp_path))
    plain = _model()
    plain.load_state_dict(load_file(str(tmp_path / "model.safetensors")))  # strict: same keys, plain tensors
    unwrapped = acc.unwrap_model(model)
    plain2 = _model()
    plain2.load_state_dict(unwrapped.state_dict())
    for a, b, c in zip(
        plain.state_dict().values(), plain2.state_dict().values(), model.state_dict().values()
    ):
        assert type(a) is torch.Tensor and torch.equal(a, c) and torch.equal(b, c)
    assert not torch.equal(plain[0].weight, _model()[0].weight)  # it trained
