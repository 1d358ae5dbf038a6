"""`commands.launch.{launch_command_parser, _validate_launch_command, launch_command}` against Accelerate's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands import launch as theirs

from accelerando.commands import launch as ours

SCRIPTS = Path(__file__).parents[2] / "integration" / "scripts"

ARGV = [
    ["train.py"],
    ["--cpu", "--num_processes", "2", "--mixed_precision", "bf16", "train.py", "--lr", "1e-3"],
    ["--multi_gpu", "--num-processes", "4", "--gpu_ids", "0,1,2,3", "--main_process_port", "29501", "-m", "pkg.t"],
    ["--use_fsdp", "--fsdp_version", "2", "--fsdp_offload_params", "true", "--fsdp_auto_wrap_policy",
     "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap", "Block", "t.py"],
    ["--use_deepspeed", "--zero_stage", "3", "--offload_param_device", "cpu", "--gradient_accumulation_steps", "4",
     "--gradient_clipping", "1.0", "--zero3_init_flag", "true", "t.py"],
    ["--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1", "--rdzv_backend", "c10d",
     "--max_restarts", "3", "--tee", "3", "--monitor_interval", "1", "t.py"],
    ["--dynamo_backend", "inductor", "--dynamo_mode", "max-autotune", "--dynamo_use_fullgraph", "--debug", "-q",
     "t.py"],
    ["--mixed_precision", "fp8", "--fp8_backend", "te", "--fp8_override_linear_precision", "false,true,false",
     "--fp8_pad_inner_dim", "false", "--fp8_amax_history_len", "16", "t.py"],
    ["--no_python", "--tpu_use_sudo", "--vm", "a", "--vm", "b", "--megatron_lm_tp_degree", "2", "run.sh", "--y"],
    ["--config_file", "c.yaml", "--num_cpu_threads_per_process", "4", "--enable_cpu_affinity", "t.py", "x"],
]  # fmt: skip
POSITIONAL = {"training_script", "training_script_args"}


@pytest.mark.parametrize("argv", ARGV, ids=lambda a: " ".join(a[:2]))
def test_parsers_give_the_same_namespace(argv: list[str]) -> None:
    mine, reference = (
        vars(ours.launch_command_parser().parse_args(argv)),
        vars(theirs.launch_command_parser().parse_args(argv)),
    )
    assert set(reference) - set(mine) <= {"nondefault"}
    for name in set(mine) & set(reference) - {"nondefault"}:
        assert (mine[name], type(mine[name])) == (reference[name], type(reference[name])), name
    typed = set(reference.get("nondefault", set())) - POSITIONAL
    assert set(mine.get("nondefault", set())) - {"vm", "env"} == typed


def test_parser_joins_subparsers_and_runs_launch_command() -> None:
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    parser = ours.launch_command_parser(sub)
    assert parser.parse_args(["t.py"]).func is ours.launch_command


VALIDATED = ("num_processes", "num_machines", "mixed_precision", "dynamo_backend", "debug", "use_cpu",
             "num_cpu_threads_per_process", "gpu_ids", "multi_gpu", "use_fsdp")  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--cpu", "t.py"],
        ["--cpu", "--num_processes", "2", "--mixed_precision", "fp16", "--debug", "t.py"],
        ["--config_file", "{cfg}", "t.py"],
        ["--config_file", "{cfg}", "--mixed_precision", "no", "--num_processes", "4", "t.py"],
    ],
)
def test_validate_completes_args_as_accelerate_does(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no per-user file
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
        "mixed_precision: bf16\nuse_cpu: true\ndebug: false\nmain_training_function: main\n"
    )
    argv = [a.format(cfg=cfg) for a in argv]
    mine, my_defaults, my_mp = ours._validate_launch_command(ours.launch_command_parser().parse_args(argv))
    reference, defaults, mp = theirs._validate_launch_command(theirs.launch_command_parser().parse_args(argv))
    assert my_mp == mp
    assert (my_defaults and my_defaults.to_dict()) == (defaults and defaults.to_dict())
    for name in VALIDATED:
        assert getattr(mine, name) == getattr(reference, name), name


def test_validate_refuses_what_accelerando_cannot_launch() -> None:
    with pytest.raises(ValueError, match="mpirun"):
        ours._validate_launch_command(
            ours.launch_command_parser().parse_args(["--mpirun_hostfile", "h", "t.py"])
        )
    with pytest.raises(ValueError, match="offloading checkpointed activations is not available"):
        ours._validate_launch_command(
            ours.launch_command_parser().parse_args(
                ["--use_fsdp", "--fsdp_activation_checkpointing_offload", "true", "t.py"]
            )
        )
    argv = ["--mixed_precision", "no", "--fp8_pad_inner_dim", "false", "t.py"]
    with pytest.raises(ValueError, match="fp8_pad_inner_dim.*has no effect with --mixed_precision=no"):
        ours._validate_launch_command(ours.launch_command_parser().parse_args(argv))
    # Accelerate's defaults for settings nobody typed (fp8_margin 0, rdzv_backend static, ...) are not "given"
    args, _, _ = ours._validate_launch_command(ours.launch_command_parser().parse_args(["--cpu", "t.py"]))
    assert args.rdzv_backend == "c10d" and args.fsdp_version == "1"


@pytest.mark.timeout(120)
def test_launch_command_runs_two_cpu_processes(tmp_path: Path) -> None:
    code = (
        "from accelerando.commands.launch import launch_command, launch_command_parser\n"
        "launch_command(launch_command_parser().parse_args(['--cpu', '--num_processes', '2', '--mixed_precision', "
        f"'bf16', '-q', {str(SCRIPTS / 'cli_report_env.py')!r}, 'a', '--b']))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    runs = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert sorted(r["rank"] for r in runs) == [0, 1]
    assert {(r["world"], r["sum"], r["ACCELERANDO_MIXED_PRECISION"]) for r in runs} == {(2, 2.0, "bf16")}
    assert all(r["argv"] == ["a", "--b"] for r in runs)
