"""utils.versions, utils.launch and FP8RecipeKwargs, compared with Accelerate (1.16, and 1.0 for FP8)."""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import accelerate.utils.launch as their_launch
import accelerate.utils.versions as their_versions
import pytest
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from packaging.version import Version

import accelerando.utils.dataclasses as our_dc
import accelerando.utils.launch as our_launch
import accelerando.utils.versions as our_versions
from accelerando.config import env


@pytest.mark.parametrize("operation", [">", ">=", "==", "!=", "<=", "<"])
@pytest.mark.parametrize("requirement", ["1.0", "2.6", "99"])
def test_compare_versions_matches_accelerate(operation: str, requirement: str) -> None:
    for library in ("torch", "numpy", Version("2.6.0")):
        mine = our_versions.compare_versions(library, operation, requirement)
        assert mine == their_versions.compare_versions(library, operation, requirement)
    assert our_versions.is_torch_version(operation, requirement) == their_versions.is_torch_version(
        operation, requirement
    )


def test_compare_versions_refuses_unknown_operations() -> None:
    with pytest.raises(ValueError, match=r"`operation` must be one of .*received '=>'"):
        our_versions.compare_versions("torch", "=>", "2.0")
    assert our_versions.torch_version == their_versions.torch_version


def _accelerate_args(argv: list[str]) -> argparse.Namespace:
    """A namespace as `accelerate launch` builds it: parsed, then completed with its defaults."""
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    return args


def _settings(variables: dict[str, str]) -> dict[str, Any]:
    settings = vars(env.read_settings(variables))
    settings["dynamo_backend"] = (settings["dynamo_backend"] or "no").lower()
    return settings


SIMPLE = [
    ["--cpu", "--mixed_precision", "bf16", "train.py", "--lr", "1"],
    ["--cpu", "--mixed_precision", "fp16", "--dynamo_backend", "inductor", "-m", "pkg.train"],
    ["--cpu", "--no_python", "--debug", "run.sh", "x"],
]


@pytest.mark.parametrize("argv", SIMPLE)
def test_simple_launcher_gives_the_same_command_and_settings(argv: list[str]) -> None:
    args = _accelerate_args(argv)
    their_cmd, their_env = their_launch.prepare_simple_launcher_cmd_env(copy.deepcopy(args))
    our_cmd, our_env = our_launch.prepare_simple_launcher_cmd_env(copy.deepcopy(args))
    assert our_cmd == their_cmd
    mine, reference = _settings(our_env), _settings(their_env)
    for key in ("use_cpu", "mixed_precision", "dynamo_backend", "debug_mode"):
        assert mine[key] == reference[key], key


@pytest.mark.filterwarnings("ignore:no accelerator found")
def test_multi_process_environment_and_torchrun_settings() -> None:
    args = _accelerate_args(["--multi_gpu", "--num_processes", "2", "--mixed_precision", "fp16", "t.py"])
    theirs, ours = copy.deepcopy(args), copy.deepcopy(args)
    their_env = their_launch.prepare_multi_gpu_env(theirs)
    our_env = our_launch.prepare_multi_gpu_env(ours)
    assert ours.nproc_per_node == theirs.nproc_per_node == "2"
    assert _settings(our_env)["mixed_precision"] == _settings(their_env)["mixed_precision"] == "fp16"
    assert ours.master_port == str(ours.main_process_port) and ours.nnodes == "1"
    assert not any(k.startswith("FSDP_") and k not in env.snapshot() for k in our_env)  # FSDP is off


@pytest.mark.filterwarnings("ignore:no accelerator found")
def test_feature_options_are_exported_only_when_the_feature_is_on() -> None:
    args = _accelerate_args(["--num_processes", "2", "--use_fsdp", "--fsdp_version", "2", "t.py"])
    exported = our_launch.prepare_multi_gpu_env(copy.deepcopy(args))
    assert exported["FSDP_VERSION"] == "2"
    assert exported[env.PREFIX + "USE_FSDP"] == "true"


def test_launch_refusals() -> None:
    both = argparse.Namespace(module=True, no_python=True, training_script="x", training_script_args=[])
    for module in (our_launch, their_launch):
        with pytest.raises(ValueError, match="--module and --no_python cannot be used together"):
            module.prepare_simple_launcher_cmd_env(copy.copy(both))
    with pytest.raises(ValueError, match="mpirun"):
        our_launch.prepare_simple_launcher_cmd_env(
            argparse.Namespace(mpirun_hostfile="hosts", training_script="x", training_script_args=[])
        )
    with pytest.raises(ValueError, match="tpu"):
        our_launch.prepare_multi_gpu_env(argparse.Namespace(tpu=True, training_script="x"))


def test_env_var_path_add(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERANDO_TEST_PATHS", "/a:/b")
    assert our_launch.env_var_path_add("ACCELERANDO_TEST_PATHS", "/c") == "/a:/b:/c"
    assert our_launch.env_var_path_add("ACCELERANDO_UNSET_PATHS", "/c") == "/c"
    assert (
        sys.executable
        in our_launch.prepare_simple_launcher_cmd_env(
            argparse.Namespace(cpu=True, training_script="t.py", training_script_args=[])
        )[0]
    )


@pytest.mark.filterwarnings("ignore:no accelerator found")
def test_deepspeed_environment_exports_the_same_zero_settings_as_accelerate() -> None:
    args = _accelerate_args(
        ["--use_deepspeed", "--num_processes", "2", "--zero_stage", "2", "--gradient_accumulation_steps", "4",
         "--offload_optimizer_device", "cpu", "t.py"]
    )  # fmt: skip
    args.deepspeed_fields_from_accelerate_config = []  # `accelerate launch` sets it before the call
    their_cmd, their_env = their_launch.prepare_deepspeed_cmd_env(copy.deepcopy(args))
    ours = copy.deepcopy(args)
    our_cmd, our_env = our_launch.prepare_deepspeed_cmd_env(ours)
    assert our_cmd is their_cmd is None and ours.nproc_per_node == "2"
    for key in ("USE_DEEPSPEED", "DEEPSPEED_ZERO_STAGE", "GRADIENT_ACCUMULATION_STEPS",
                "DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"):  # fmt: skip
        assert our_env[env.PREFIX + key] == their_env["ACCELERATE_" + key], key
    multinode = argparse.Namespace(
        **{**vars(args), "num_machines": 2, "deepspeed_multinode_launcher": "pdsh"}
    )
    with pytest.raises(ValueError, match="deepspeed_multinode_launcher='pdsh'"):
        our_launch.prepare_deepspeed_cmd_env(multinode)


@pytest.mark.parametrize("pod", [False, True])
def test_prepare_tpu_and_filter_args_equal_accelerates(pod: bool) -> None:
    args = argparse.Namespace(
        mixed_precision="bf16", downcast_bf16=True, debug=True, tpu_vm=["v"], tpu_name="n"
    )
    mine = our_launch.prepare_tpu(copy.deepcopy(args), {"A": "1"}, pod=pod)
    reference = their_launch.prepare_tpu(copy.deepcopy(args), {"A": "1"}, pod=pod)
    assert (vars(mine[0]), mine[1]) == (vars(reference[0]), reference[1])
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--name", default="x")
    given = argparse.Namespace(lr=2.0, num_processes=4)
    for defaults in ([], ["--name", "y"]):
        assert our_launch._filter_args(given, parser, defaults) == their_launch._filter_args(
            given, parser, defaults
        )


# ---- FP8RecipeKwargs: removed from Accelerate after 1.0; its 1.0 behaviour is the specification ----


@pytest.fixture
def installed_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend both FP8 packages are installed (neither is here), to check the values they would get."""
    monkeypatch.setitem(our_dc._FP8_BACKEND_PACKAGES, "TE", "torch")
    monkeypatch.setitem(our_dc._FP8_BACKEND_PACKAGES, "MSAMP", "torch")


def test_fp8_recipe_kwargs_defaults_and_deprecation(installed_backends: None) -> None:
    with pytest.warns(FutureWarning, match="FP8RecipeKwargs is deprecated"):
        recipe = our_dc.FP8RecipeKwargs(backend="te")
    assert vars(recipe) == {
        "opt_level": "O2", "use_autocast_during_eval": False, "margin": 0, "interval": 1, "fp8_format": "HYBRID",
        "amax_history_len": 1024, "amax_compute_algo": "most_recent",
        "override_linear_precision": (False, False, False), "backend": "TE",
    }  # fmt: skip
    assert isinstance(recipe, our_dc.KwargsHandler)


def test_fp8_recipe_kwargs_reads_the_launchers_variables(
    installed_backends: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"BACKEND": "msamp", "OPT_LEVEL": "O1", "MARGIN": "2", "FORMAT": "e4m3",
                        "AMAX_COMPUTE_ALGO": "MAX", "OVERRIDE_DGRAD": "1"}.items():  # fmt: skip
        monkeypatch.setenv(f"ACCELERATE_FP8_{name}", value)
    with pytest.warns(FutureWarning):
        recipe = our_dc.FP8RecipeKwargs()
    assert (recipe.backend, recipe.opt_level, recipe.margin) == ("MSAMP", "O1", 2)
    assert (recipe.fp8_format, recipe.amax_compute_algo) == ("E4M3", "max")
    assert recipe.override_linear_precision == (False, True, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "ao"}, "`backend` must be 'MSAMP' or 'TE'"),
        ({"backend": "te", "fp8_format": "E3M4"}, "`fp8_format` must be one of HYBRID or E4M3 or E5M2"),
        (
            {"backend": "te", "amax_compute_algo": "mean"},
            "`amax_compute_algo` must be one of max or most_recent",
        ),
        ({"backend": "msamp", "opt_level": "O3"}, "`opt_level` must be one of O1 or O2"),
    ],
)
def test_fp8_recipe_kwargs_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=message):
        our_dc.FP8RecipeKwargs(**kwargs)


def test_fp8_recipe_kwargs_needs_its_backend_package() -> None:
    for backend, package in (("te", "transformer_engine"), ("msamp", "msamp")):
        with pytest.warns(FutureWarning), pytest.raises(ImportError, match=f"needs the '{package}' package"):
            our_dc.FP8RecipeKwargs(backend=backend)
