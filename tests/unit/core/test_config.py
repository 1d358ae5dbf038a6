from datetime import timedelta

import pytest

from accelerando import (
    Accelerator,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
)
from accelerando.config import env
from accelerando.config.options import PrecisionType, TorchDynamoPlugin


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("dispatch_batches", True),
        ("split_batches", True),
        ("even_batches", False),
        ("use_seedable_sampler", True),
    ],
)
def test_moved_dataloader_arguments_still_apply_with_a_warning(name, value):
    with pytest.warns(FutureWarning, match=rf"{name}=.*DataLoaderConfiguration\({name}="):
        acc = Accelerator(cpu=True, **{name: value})
    assert getattr(acc.dataloader_config, name) == value
    assert getattr(acc, name) == value


def test_moved_argument_contradicting_the_configuration_is_refused():
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match=r"split_batches=True.*split_batches=False"),
    ):
        Accelerator(
            cpu=True, split_batches=True, dataloader_config=DataLoaderConfiguration(split_batches=False)
        )


def test_moved_argument_agreeing_with_the_configuration_is_accepted():
    config = DataLoaderConfiguration(even_batches=False)
    with pytest.warns(FutureWarning):
        acc = Accelerator(cpu=True, even_batches=False, dataloader_config=config)
    assert acc.dataloader_config.even_batches is False


def test_use_fp16_is_gone():
    with pytest.raises(TypeError, match="mixed_precision='fp16'"):
        Accelerator(cpu=True, use_fp16=True)


def test_unknown_mixed_precision_is_refused_with_choices():
    with pytest.raises(ValueError, match=r"'fp32'.*no, fp8, fp16, bf16"):
        Accelerator(cpu=True, mixed_precision="fp32")


@pytest.mark.parametrize("steps", [0, -1, 1.5])
def test_bad_accumulation_steps(steps):
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        Accelerator(cpu=True, gradient_accumulation_steps=steps)


def test_accumulation_plugin_and_steps_are_exclusive():
    with pytest.raises(ValueError, match="either"):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(3),
        )


def test_unknown_and_duplicate_handlers():
    with pytest.raises(TypeError, match="KwargsHandler"):
        Accelerator(cpu=True, kwargs_handlers=[{"timeout": 3}])
    with pytest.raises(ValueError, match="only pass one AutocastKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[AutocastKwargs(), AutocastKwargs(enabled=False)])


def test_handlers_are_sorted_into_slots():
    ddp = DistributedDataParallelKwargs(bucket_cap_mb=7)
    acc = Accelerator(cpu=True, kwargs_handlers=[ddp, GradScalerKwargs(init_scale=8.0)])
    assert acc.ddp_handler is ddp and acc.scaler_handler.init_scale == 8.0
    assert ddp.to_kwargs() == {"bucket_cap_mb": 7}


def test_environment_is_below_explicit_arguments(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # Accelerate's alias is accepted
    monkeypatch.setenv("ACCELERANDO_GRADIENT_ACCUMULATION_STEPS", "4")
    acc = Accelerator(cpu=True)
    assert acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 4
    from accelerando.state import reset_runtime

    reset_runtime()
    acc = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=2)
    assert acc.mixed_precision == "no" and acc.gradient_accumulation_steps == 2


def test_bad_boolean_in_environment_names_variable(monkeypatch):
    monkeypatch.setenv("ACCELERANDO_USE_CPU", "maybe")
    with pytest.raises(ValueError, match="ACCELERANDO_USE_CPU"):
        env.read_settings()


def test_second_accelerator_with_other_precision_is_refused():
    Accelerator(cpu=True, mixed_precision="bf16")
    with pytest.raises(ValueError, match="already has an Accelerator"):
        Accelerator(cpu=True, mixed_precision="fp16")


def test_enums_and_dynamo_plugin():
    assert "fp16" in PrecisionType and "fp32" not in PrecisionType
    assert str(PrecisionType.BF16) == "bf16"
    assert TorchDynamoPlugin(backend="inductor").to_kwargs() == {
        "backend": "inductor",
        "mode": "default",
        "fullgraph": False,
        "dynamic": None,
    }
    assert "mode" not in TorchDynamoPlugin(backend="inductor", options={"trace.enabled": False}).to_kwargs()
    with pytest.raises(ValueError, match="dynamo backend 'nope'"):
        TorchDynamoPlugin(backend="nope")


def test_init_process_group_kwargs_defaults():
    kwargs = InitProcessGroupKwargs(timeout=timedelta(seconds=5))
    assert kwargs.to_kwargs() == {"timeout": timedelta(seconds=5)}


@pytest.mark.parametrize("prefix", ["ACCELERATE_", "ACCELERANDO_"])
def test_dynamo_plugin_reads_the_launcher_environment_like_accelerate(monkeypatch, prefix):
    from accelerate.utils import TorchDynamoPlugin as TheirPlugin

    for name, value in [
        ("DYNAMO_BACKEND", "inductor"),
        ("DYNAMO_MODE", "max-autotune"),
        ("DYNAMO_USE_FULLGRAPH", "true"),
        ("DYNAMO_USE_DYNAMIC", "false"),
        ("DYNAMO_USE_REGIONAL_COMPILATION", "true"),
    ]:
        monkeypatch.setenv(prefix + name, value)
        monkeypatch.setenv("ACCELERATE_" + name, value)
    ours, theirs = TorchDynamoPlugin(), TheirPlugin()
    for field in ("mode", "fullgraph", "dynamic", "use_regional_compilation"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert str(ours.backend) == theirs.backend.value == "INDUCTOR"
    assert ours.to_kwargs()["mode"] == "max-autotune"  # a launcher-set value reaches torch.compile
    assert TorchDynamoPlugin(mode="reduce-overhead").mode == "reduce-overhead"  # explicit beats env


def test_dynamo_plugin_defaults_match_accelerate_without_environment(monkeypatch):
    from accelerate.utils import TorchDynamoPlugin as TheirPlugin

    for prefix in ("ACCELERATE_", "ACCELERANDO_"):
        for name in ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC", "USE_REGIONAL_COMPILATION"):
            monkeypatch.delenv(f"{prefix}DYNAMO_{name}", raising=False)
    ours, theirs = TorchDynamoPlugin(), TheirPlugin()
    assert (str(ours.backend), ours.mode, ours.fullgraph, ours.dynamic, ours.use_regional_compilation) == (
        theirs.backend.value,
        theirs.mode,
        theirs.fullgraph,
        theirs.dynamic,
        theirs.use_regional_compilation,
    )
