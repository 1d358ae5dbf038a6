"""DeepSpeedPlugin and the engine config: "auto" filled from the Accelerator, contradictions refused
naming both values, before any engine (or process group) exists. Pure: no deepspeed import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando.config import env
from accelerando.config.deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig, plugins_from, reconcile
from accelerando.config.resolve import resolve
from accelerando.strategies.base import PrepareRequest
from accelerando.strategies.deepspeed import _pair
from accelerando.strategies.deepspeed_config import EngineRequest, engine_config
from accelerando.utils import DummyOptim, DummyScheduler


def accelerator(plugins: Any, environ: dict[str, str] | None = None, **kw: Any) -> Any:
    """The ResolvedConfig `Accelerator(deepspeed_plugin(s)=..., **kw)` would build (no process group)."""
    args: dict[str, Any] = dict(
        cpu=True, mixed_precision=None, gradient_accumulation_steps=1, gradient_accumulation_plugin=None,
        dataloader_config=None, project_dir=None, project_config=None, kwargs_handlers=None, dynamo_backend=None,
        dynamo_plugin=None, device_placement=True, step_scheduler_with_optimizer=True, rng_types=None,
        fsdp_plugin=None,
    )  # fmt: skip
    args.update(kw)
    given = (None, plugins) if isinstance(plugins, dict) else (plugins, None)
    return resolve(**args, settings=env.read_settings(environ or {}), deepspeed_plugins=given)


def test_a_plugin_without_file_synthesizes_accelerates_config() -> None:
    plugin = DeepSpeedPlugin(zero_stage=3, offload_param_device="CPU", zero3_save_16bit_model=True)
    config = plugin.deepspeed_config
    assert config["train_micro_batch_size_per_gpu"] == "auto" and config["gradient_clipping"] == "auto"
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert plugin.zero3_init_flag is True  # ZeRO-3's default, as in Accelerate
    assert DeepSpeedPlugin().stage == 2 and DeepSpeedPlugin().zero3_init_flag is False


def test_fields_fill_the_files_auto_and_contradictions_name_both(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": "auto"}, "gradient_clipping": 0.5}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=3, gradient_clipping=0.5)
    assert plugin.get_value("zero_optimization.stage") == 3 and plugin.gradient_clipping == 0.5
    assert DeepSpeedPlugin(hf_ds_config=str(path)).gradient_clipping == 0.5  # read back from the file
    with pytest.raises(
        ValueError, match=r"gradient_clipping=1.0 contradicts the DeepSpeed config's gradient_clipping=0.5"
    ):
        DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=1.0)
    with pytest.raises(ValueError, match="no zero_optimization section"):
        DeepSpeedPlugin(hf_ds_config={"train_batch_size": 8})
    with pytest.raises(ValueError, match="offload_param_device='disk'; accepted: none, cpu, nvme"):
        DeepSpeedPlugin(offload_param_device="disk")
    with pytest.raises(ValueError, match="is not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "bad.json"))
    with pytest.warns(UserWarning, match="zero3_init_flag=True.*no effect with ZeRO stage 2"):
        assert DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True).zero3_init_flag is False


def test_the_launchers_variables_fill_unset_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "1")
    monkeypatch.setenv("ACCELERANDO_GRADIENT_CLIPPING", "0.25")
    monkeypatch.setenv("ACCELERANDO_DEEPSPEED_MOE_LAYER_CLS_NAMES", "MoEBlock")
    plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.gradient_clipping, plugin.transformer_moe_cls_names) == (
        1,
        0.25,
        "MoEBlock",
    )
    assert DeepSpeedPlugin(zero_stage=3).zero_stage == 3  # an argument wins over the environment


def test_the_accelerator_and_the_plugins_agree_on_precision_and_accumulation() -> None:
    bf16 = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "gradient_accumulation_steps": 4}
    cfg = accelerator(DeepSpeedPlugin(hf_ds_config=bf16))
    assert (cfg.mixed_precision, cfg.gradient.num_steps) == ("bf16", 4)  # adopted from the config
    cfg = accelerator(DeepSpeedPlugin(), mixed_precision="bf16", gradient_accumulation_steps=3)
    plugin = cfg.deepspeed_plugins["default"]
    assert plugin.deepspeed_config["bf16"] == {"enabled": True} and plugin.deepspeed_config["fp16"] == {
        "enabled": False
    }
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 3
    with pytest.raises(
        ValueError,
        match=r"mixed_precision='fp16' \(Accelerator argument\) contradicts DeepSpeed plugin 'default''s bf16.enabled=True",
    ):
        accelerator(DeepSpeedPlugin(hf_ds_config=bf16), mixed_precision="fp16")
    with pytest.raises(
        ValueError,
        match=r"gradient_accumulation_steps=2 \(Accelerator argument\) contradicts DeepSpeed plugin 'default''s gradient_accumulation_steps=4",
    ):
        accelerator(DeepSpeedPlugin(hf_ds_config=bf16), gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match=r"launcher \(ACCELERANDO_MIXED_PRECISION\)"):
        accelerator(DeepSpeedPlugin(hf_ds_config=bf16), {"ACCELERANDO_MIXED_PRECISION": "fp16"})
    with pytest.raises(ValueError, match="disagree on gradient_accumulation_steps"):
        accelerator(
            {
                "a": DeepSpeedPlugin(gradient_accumulation_steps=2),
                "b": DeepSpeedPlugin(gradient_accumulation_steps=3),
            }
        )
    # fp8 runs inside a bf16 engine, as Accelerate configures it; an fp16 engine contradicts it
    fp8_plugin = DeepSpeedPlugin()
    assert reconcile(
        {"a": fp8_plugin},
        mixed_precision="fp8",
        precision_from="x",
        gradient_accumulation_steps=1,
        accumulation_from=None,
    ) == ("fp8", 1)
    assert fp8_plugin.get_value("bf16.enabled") is True and fp8_plugin.get_value("fp16.enabled") is False
    with pytest.raises(
        ValueError, match=r"mixed_precision='fp8' \(x\) contradicts DeepSpeed plugin 'a''s fp16"
    ):
        reconcile(
            {
                "a": DeepSpeedPlugin(
                    hf_ds_config={"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}
                )
            },
            mixed_precision="fp8",
            precision_from="x",
            gradient_accumulation_steps=1,
            accumulation_from=None,
        )


def test_plugin_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="either deepspeed_plugin or deepspeed_plugins"):
        plugins_from(DeepSpeedPlugin(), {"a": DeepSpeedPlugin()}, False)
    with pytest.raises(TypeError, match=r"deepspeed_plugins\['b'\] must be a DeepSpeedPlugin, got dict"):
        plugins_from(None, {"a": DeepSpeedPlugin(), "b": {}}, False)
    assert plugins_from(None, None, False) is None
    assert list(plugins_from(DeepSpeedPlugin(), None, False) or {}) == ["default"]
    cfg = accelerator({"student": DeepSpeedPlugin(), "teacher": DeepSpeedPlugin(zero_stage=3)})
    assert list(cfg.deepspeed_plugins) == ["student", "teacher"] and cfg.use_deepspeed


def net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))


def test_the_engine_config_fills_auto_from_what_the_accelerator_knows() -> None:
    plugin = DeepSpeedPlugin(zero_stage=2)
    model = net()
    request = EngineRequest(model, torch.optim.SGD(model.parameters(), lr=0.1))
    config = engine_config(plugin, request, batch_sizes=[8, 4], accumulation=2, world_size=2)
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["train_batch_size"] == 16
    assert config["gradient_clipping"] == 0.0 and config["zero_allow_untested_optimizer"] is True
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == "auto"  # the plugin keeps its "auto"
    inference = engine_config(plugin, EngineRequest(net()), batch_sizes=[], accumulation=1, world_size=2)
    assert inference["train_micro_batch_size_per_gpu"] == 1
    offload = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu")
    assert (
        engine_config(offload, request, batch_sizes=[2], accumulation=1, world_size=1)[
            "zero_force_ds_cpu_optimizer"
        ]
        is False
    )


@pytest.mark.parametrize(
    ("config", "request_kind", "message"),
    [
        ({"train_micro_batch_size_per_gpu": 3}, "torch", "train_micro_batch_size_per_gpu=3 contradicts the prepared data loader's per-process batch size 4"),
        ({"train_batch_size": 10}, "torch", "train_batch_size=10 contradicts micro batch 4 x accumulation 1 x 2 processes = 8"),
        ({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}, "torch", "defines an optimizer and the code passed a torch optimizer"),
        ({}, "dummy", "a DummyOptim needs an optimizer section"),
        ({"reduce_bucket_size": "auto"}, "torch", "still has \"auto\" for reduce_bucket_size"),
    ],
)  # fmt: skip
def test_contradictions_are_refused_before_any_engine(
    config: dict[str, Any], request_kind: str, message: str
) -> None:
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}, **config})
    model = net()
    optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if request_kind == "torch"
        else DummyOptim(model.parameters())
    )
    with pytest.raises(ValueError) as err:
        engine_config(plugin, EngineRequest(model, optimizer), batch_sizes=[4], accumulation=1, world_size=2)
    assert message in str(err.value)


def test_hidden_size_autos_and_dummy_scheduler_fill() -> None:
    config = {
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": "auto",
                                                          "total_num_steps": "auto", "warmup_min_lr": "auto"}},
    }  # fmt: skip
    model = net()
    model.config = type("Config", (), {"hidden_size": 8})()  # type: ignore[assignment]
    optimizer = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.1)
    scheduler = DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    out = engine_config(
        DeepSpeedPlugin(hf_ds_config=config),
        EngineRequest(model, optimizer, scheduler),
        batch_sizes=[2],
        accumulation=1,
        world_size=2,
    )
    assert out["zero_optimization"]["reduce_bucket_size"] == 64
    assert out["zero_optimization"]["stage3_param_persistence_threshold"] == 80
    assert out["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1}
    assert out["scheduler"]["params"] == {
        "warmup_max_lr": 3e-4,
        "warmup_num_steps": 2,
        "total_num_steps": 5,
        "warmup_min_lr": 0,
    }


def test_optimizers_and_schedulers_pair_with_their_models() -> None:
    a, b = net(), net()
    opt = torch.optim.SGD(b.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    pairs = _pair(PrepareRequest(models=[a, b], optimizers=[opt], schedulers=[sched]))
    assert (pairs[0].optimizer, pairs[1].optimizer, pairs[1].scheduler) == (None, opt, sched)
    both = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    with pytest.raises(ValueError, match="updates parameters of several models"):
        _pair(PrepareRequest(models=[a, b], optimizers=[both]))
    with pytest.raises(ValueError, match="optimizer is not prepared in the same call"):
        _pair(PrepareRequest(models=[a], schedulers=[sched]))


def test_hf_deepspeed_config_dotted_access() -> None:
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    assert config.is_zero3() and config.is_offload() and not config.is_zero2()
    assert config.get_value("zero_optimization.offload_param.device") == "cpu"
    assert config.get_value("missing.key", 7) == 7
    config.del_config_sub_tree("zero_optimization.offload_param")
    assert not config.is_offload()


def test_the_names_and_fields_are_accelerates() -> None:
    import dataclasses
    import inspect

    import accelerate.utils

    import accelerando
    import accelerando.utils

    theirs = [f.name for f in dataclasses.fields(accelerate.utils.DeepSpeedPlugin) if f.init]
    ours = [f.name for f in dataclasses.fields(DeepSpeedPlugin) if f.init]
    assert [n for n in theirs if n not in ("enable_msamp", "msamp_opt_level")] == ours
    assert accelerando.DeepSpeedPlugin is accelerando.utils.DeepSpeedPlugin is DeepSpeedPlugin
    for name in ("DummyOptim", "DummyScheduler", "HfDeepSpeedConfig", "get_active_deepspeed_plugin"):
        mine, accelerates = getattr(accelerando.utils, name), getattr(accelerate.utils, name)
        assert list(inspect.signature(mine).parameters) == list(inspect.signature(accelerates).parameters), (
            name
        )
    assert "GatheredParameters" in dir(accelerando.utils.operations)
