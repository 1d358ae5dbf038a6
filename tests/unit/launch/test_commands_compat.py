"""Accelerate's command-module names (`to_fsdp2`, `tpu`, `estimate`), compared with the installed Accelerate."""

from __future__ import annotations

import argparse
import copy

import pytest
import yaml

from accelerando.commands import estimate, to_fsdp2, tpu
from accelerando.commands.main import main

FSDP1_CONFIGS = [
    {"distributed_type": "FSDP", "fsdp_config": {
        "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_sync_module_states": True, "fsdp_use_orig_params": True, "fsdp_forward_prefetch": False,
        "fsdp_offload_params": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "Block",
        "fsdp_cpu_ram_efficient_loading": True, "fsdp_activation_checkpointing": False}},
    {"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_version": 1}},
    {"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": "HYBRID_SHARD_ZERO2"}},
    {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True}},
    {"distributed_type": "MULTI_GPU"},
]  # fmt: skip


@pytest.mark.parametrize("config", FSDP1_CONFIGS)
def test_fsdp1_config_converts_like_accelerate(config):
    from accelerate.commands.to_fsdp2 import convert_config_to_fsdp2 as theirs

    assert to_fsdp2.convert_config_to_fsdp2(copy.deepcopy(config)) == theirs(copy.deepcopy(config))


def test_to_fsdp2_command_writes_a_launchable_file_and_refuses_to_clobber(tmp_path):
    from accelerando.config.yaml_config import load_config

    src, out = tmp_path / "fsdp1.yaml", tmp_path / "fsdp2.yaml"
    src.write_text(yaml.safe_dump({**FSDP1_CONFIGS[0], "num_processes": 2}))
    assert main(["to-fsdp2", "--config_file", str(src), "--output_file", str(out)]) == 0
    converted = yaml.safe_load(out.read_text())
    assert converted["fsdp_config"]["fsdp_version"] == 2
    assert converted["fsdp_config"]["fsdp_reshard_after_forward"] is True
    assert "fsdp_sharding_strategy" not in converted["fsdp_config"]
    assert load_config(out).values  # the launcher reads it
    assert main(["to-fsdp2", "--config_file", str(src), "--output_file", str(out)]) == 2  # exists
    assert main(["to-fsdp2", "--config_file", str(src)]) == 2  # no output and no --overwrite
    assert main(["to-fsdp2", "--config_file", str(src), "--overwrite"]) == 0
    assert yaml.safe_load(src.read_text()) == converted
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def _tpu_args(parser_module, argv):
    parser = parser_module(argparse.ArgumentParser().add_subparsers())
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--tpu_name", "pod", "--tpu_zone", "us-central1-a", "--command", "echo hi", "--debug"],
        ["--tpu_name", "pod", "--tpu_zone", "z", "--command", "a", "--command", "b", "--use_alpha", "--debug"],
        ["--tpu_name", "pod", "--tpu_zone", "z", "--command", "ls", "--install_accelerate", "--debug",
         "--accelerate_version", "1.2.3"],
    ],
)  # fmt: skip
def test_tpu_config_debug_prints_accelerates_gcloud_command(argv, capsys, tmp_path, monkeypatch):
    from accelerate.commands.tpu import tpu_command_launcher, tpu_command_parser

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no default config file on either side
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", str(tmp_path / "none.yaml"))
    tpu.tpu_command_launcher(tpu.tpu_command_parser().parse_args(argv))
    ours = capsys.readouterr().out
    tpu_command_launcher(tpu_command_parser().parse_args(argv))
    theirs = capsys.readouterr().out
    assert ours.replace("accelerando", "accelerate") == theirs


def test_tpu_config_reads_the_config_file_and_names_what_is_missing(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"tpu_name": "p", "tpu_zone": "z", "commands": ["x", "y"]}))
    tpu.tpu_command_launcher(tpu.tpu_command_parser().parse_args(["--config_file", str(cfg), "--debug"]))
    assert capsys.readouterr().out.strip().endswith("--command cd /usr/share; x; y --worker all")
    cfg.write_text(yaml.safe_dump({"tpu_zone": "z"}))
    with pytest.raises(ValueError, match="--command or --command_file"):
        tpu.gcloud_command(tpu.tpu_command_parser().parse_args(["--config_file", str(cfg)]))
    with pytest.raises(ValueError, match="--tpu_name and --tpu_zone"):
        tpu.gcloud_command(tpu.tpu_command_parser().parse_args(["--config_file", str(cfg), "--command", "x"]))


def test_estimate_gather_data_has_accelerates_row_shape(tmp_path, monkeypatch):
    (tmp_path / "tiny_net.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 5))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = estimate.estimate_command_parser().parse_args(["tiny_net:build", "--dtypes", "float32", "float16"])
    rows = estimate.gather_data(args)
    params = 10 * 20 + 20 + 20 * 5 + 5
    assert [r[0] for r in rows] == ["float32", "float16"]
    assert rows[0][1:3] == [220 * 4.0, params * 4.0] and rows[1][1:3] == [220 * 2.0, params * 2.0]
    assert set(rows[0][3]) == {"model", "optimizer", "gradients", "step"}
    assert rows[0][3]["model"] == params * 4.0 and rows[0][3]["optimizer"] == params * 8.0
