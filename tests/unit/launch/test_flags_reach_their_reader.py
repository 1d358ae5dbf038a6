"""Every `accelerando launch` option either reaches the code that reads it or is refused.

One row per option of `launch/flags.py` (a new option without a row fails
`test_every_option_has_a_row`). A `Reaches` row gives the option on the command line, resolves
the launch in-process, exports what the launcher would export to the training processes, and
asks the reader itself with that environment: `config.env.read_settings` + `config.resolve.resolve`
(what `Accelerator()` runs), the FSDP plugin, the worker bootstrap, or torchrun's `LaunchConfig`
for launcher-only settings. A `Refused` row checks the message naming what is missing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from accelerando.config import env
from accelerando.config.deepspeed import DeepSpeedPlugin
from accelerando.config.fsdp import FullyShardedDataParallelPlugin, settings_from_env
from accelerando.config.options import DynamoBackend
from accelerando.config.resolve import ResolvedConfig
from accelerando.config.resolve import resolve as resolve_config
from accelerando.launch import worker
from accelerando.launch.flags import BY_NAME, OPTIONS
from accelerando.launch.settings import Detected, Resolved, child_exports, resolve
from accelerando.launch.torchrun import agent_log_dir, build_launch_config

CPU = Detected(device_type="cpu", device_count=0, cpu_cores=8)
GPU4 = Detected(device_type="cuda", device_count=4, cpu_cores=32)
TWO_MACHINES = {"num_machines": 2, "main_process_ip": "10.0.0.1", "num_processes": 4}
FP8 = {"mixed_precision": "fp8"}
AO = {**FP8, "fp8_backend": "ao"}
TE = {**FP8, "fp8_backend": "te"}
MSAMP = {**FP8, "fp8_backend": "msamp"}
# A machine where every fp8 backend can run (the launch-time probe's facts).
H100 = Detected(
    device_type="cuda", device_count=1, cpu_cores=8, fp8_packages=frozenset({"ao", "te", "msamp"}),
    compute_capability=(9, 0),
)  # fmt: skip
Reader = Callable[[Resolved, dict[str, str]], Any]


def launch(cli: Mapping[str, Any], detected: Detected = CPU, **kw: Any) -> Resolved:
    return resolve(cli, {}, None, detected, free_port=lambda: 29400, **kw)


# ---- readers: what the library (or torch's agent) sees of a launch --------------------------------


def settings(field: str) -> Reader:
    """The launcher contract as every process parses it (`config.env.read_settings`)."""
    return lambda r, exported: getattr(env.read_settings(exported), field)


def accelerator_config(path: str) -> Reader:
    """A field of the ResolvedConfig `Accelerator()` builds from that environment (no arguments given)."""

    def read(r: Resolved, exported: dict[str, str]) -> Any:
        config: Any = resolve_config(
            cpu=False, mixed_precision=None, gradient_accumulation_steps=1, gradient_accumulation_plugin=None,
            dataloader_config=None, project_dir=None, project_config=None, kwargs_handlers=None,
            dynamo_backend=None, dynamo_plugin=None, device_placement=True, step_scheduler_with_optimizer=True,
            rng_types=None, fsdp_plugin=None, settings=env.read_settings(exported),
        )  # fmt: skip
        assert isinstance(config, ResolvedConfig)
        for part in path.split("."):
            config = config[part] if isinstance(config, dict) else getattr(config, part)
        return config

    return read


def fsdp_plugin(field: str) -> Reader:
    """A field of the FSDP plugin built in a process that received these variables."""

    def read(r: Resolved, exported: dict[str, str]) -> Any:
        with env.patch_environment(**exported):
            return getattr(FullyShardedDataParallelPlugin(), field)

    return read


def deepspeed_plugin(field: str) -> Reader:
    """A field of the DeepSpeed plugin built in a process that received these variables."""

    def read(r: Resolved, exported: dict[str, str]) -> Any:
        with env.patch_environment(**exported):
            return getattr(DeepSpeedPlugin(), field)

    return read


def agent(read: Callable[[Any], Any]) -> Reader:
    """torchrun's LaunchConfig, built from the resolved settings (launcher-only options)."""

    def build(r: Resolved, exported: dict[str, str]) -> Any:
        with agent_log_dir(r["log_dir"]) as log_dir:
            return read(build_launch_config(r, log_dir))

    return build


def exported_as(variable: str) -> Reader:
    """For settings read outside accelerando (OpenMP, the CUDA runtime): the variable they read."""
    return lambda r, exported: exported.get(variable)


def pinned_cores(r: Resolved, exported: dict[str, str]) -> Any:
    """The worker bootstrap's pinning, for local rank 0 of 1 (its whole share: a no-op here)."""
    return worker.pin_to_core_share({**exported, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})


# ---- the table ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reaches:
    value: Any
    read: Reader
    expected: Any
    also: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # other flags it needs
    detected: Detected = CPU
    needs: str | None = None  # a package the reader imports


@dataclasses.dataclass(frozen=True)
class Refused:
    value: Any
    message: str
    also: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class NoEffect:
    """Accepted for Accelerate's files, where it always appears, and documented as having no effect."""

    why: str
    value: Any = True
    also: Mapping[str, Any] = dataclasses.field(default_factory=dict)


NO_DS_RUNNER = "DeepSpeed's own multi-node runner (hostfile, include/exclude filters) is not used"
DS = {"use_deepspeed": True}
NO_PC = "is not available yet in accelerando"

ROWS: dict[str, list[Reaches | Refused | NoEffect]] = {
    "debug": [Reaches(True, settings("debug_mode"), True)],
    "as_accelerate": [Reaches(True, lambda r, exported: worker.as_accelerate_requested(exported), True)],
    "cpu": [Reaches(True, accelerator_config("cpu"), True, detected=GPU4)],
    "multi_gpu": [Reaches(True, agent(lambda lc: lc.nproc_per_node), 4, detected=GPU4)],
    "tpu": [Refused(True, "does not launch TPU")],
    "mixed_precision": [Reaches("bf16", accelerator_config("mixed_precision"), "bf16")],
    "num_processes": [Reaches(2, agent(lambda lc: lc.nproc_per_node), 2)],
    "nproc_per_node": [Reaches(3, agent(lambda lc: lc.nproc_per_node), 3)],
    "num_machines": [Reaches(2, agent(lambda lc: (lc.min_nodes, lc.max_nodes)), (2, 2), also=TWO_MACHINES)],
    "num_cpu_threads_per_process": [Reaches(3, exported_as("OMP_NUM_THREADS"), "3")],
    "enable_cpu_affinity": [Reaches(True, pinned_cores, sorted(os.sched_getaffinity(0)))],
    "dynamo_backend": [Reaches("eager", accelerator_config("dynamo.backend"), DynamoBackend.EAGER)],
    "dynamo_mode": [Reaches("max-autotune", accelerator_config("dynamo.mode"), "max-autotune")],
    "dynamo_use_fullgraph": [Reaches(True, accelerator_config("dynamo.fullgraph"), True)],
    "dynamo_use_dynamic": [Reaches(True, accelerator_config("dynamo.dynamic"), True)],
    "dynamo_use_regional_compilation": [
        Reaches(True, accelerator_config("dynamo.use_regional_compilation"), True)
    ],
    "use_deepspeed": [Reaches(True, accelerator_config("deepspeed_plugins.default.zero_stage"), 2)],
    "use_fsdp": [Reaches(True, accelerator_config("use_fsdp"), True)],
    "use_parallelism_config": [Reaches(True, accelerator_config("parallelism.tp_size"), 1)],
    "parallelism_config_dp_replicate_size": [
        Reaches(2, accelerator_config("parallelism.dp_replicate_size"), 2, also={"num_processes": 2})
    ],
    "parallelism_config_dp_shard_size": [
        Reaches(
            2, accelerator_config("parallelism.dp_shard_size"), 2, also={"num_processes": 2, "use_fsdp": True}
        ),
        Refused(2, "sharding parameters (and context parallelism) needs FSDP", also={"num_processes": 2}),
    ],
    "parallelism_config_tp_size": [
        Reaches(2, accelerator_config("parallelism.tp_size"), 2, also={"num_processes": 2}),
        Refused(2, "cp_size=1 = 2, but the launch starts 4 processes", also={"num_processes": 4}),
    ],
    "parallelism_config_cp_size": [
        Reaches(2, accelerator_config("parallelism.cp_size"), 2, also={"num_processes": 2, "use_fsdp": True}),
        Refused(2, "needs FSDP", also={"num_processes": 2}),
    ],
    # read by ParallelismConfig / TorchContextParallelConfig from the worker's environment
    "parallelism_config_cp_backend": [
        Reaches("torch", exported_as("PARALLELISM_CONFIG_CP_BACKEND"), "torch")
    ],
    "parallelism_config_cp_comm_strategy": [
        Reaches("alltoall", exported_as("PARALLELISM_CONFIG_CP_COMM_STRATEGY"), "alltoall")
    ],
    "use_megatron_lm": [Refused(True, "does not launch Megatron-LM")],
    "gpu_ids": [
        Reaches("0,1", exported_as("CUDA_VISIBLE_DEVICES"), "0,1", also={"num_processes": 2}, detected=GPU4)
    ],
    "same_network": [NoEffect("Accelerate writes it into every config; torchrun's rendezvous needs no hint")],
    "machine_rank": [Reaches(1, agent(lambda lc: lc.rdzv_configs["is_host"]), False, also=TWO_MACHINES)],
    "main_process_ip": [
        Reaches("10.0.0.1", agent(lambda lc: lc.rdzv_endpoint), "10.0.0.1:29500", also=TWO_MACHINES)
    ],
    "main_process_port": [Reaches(29511, agent(lambda lc: lc.rdzv_endpoint), "127.0.0.1:29511")],
    "tee": [Reaches("3", agent(lambda lc: int(lc.logs_specs._tee)), 3)],
    "log_dir": [Reaches("/tmp/acc-logs", agent(lambda lc: lc.logs_specs._root_log_dir), "/tmp/acc-logs")],
    "role": [Reaches("trainer", agent(lambda lc: lc.role), "trainer")],
    "rdzv_backend": [Reaches("static", agent(lambda lc: lc.rdzv_backend), "static", also=TWO_MACHINES)],
    "rdzv_conf": [Reaches("join_timeout=5", agent(lambda lc: lc.rdzv_configs["join_timeout"]), "5")],
    "max_restarts": [Reaches(2, agent(lambda lc: lc.max_restarts), 2)],
    "monitor_interval": [Reaches(0.5, agent(lambda lc: lc.monitor_interval), 0.5)],
    "gradient_accumulation_steps": [Reaches(4, accelerator_config("gradient.num_steps"), 4)],
    "gradient_clipping": [
        Reaches(0.5, deepspeed_plugin("gradient_clipping"), 0.5, also=DS),
        Refused(
            1.0, "has no effect without --use_deepspeed; without DeepSpeed call accelerator.clip_grad_norm_"
        ),
    ],
    "deepspeed_config_file": [
        Refused("/nonexistent/ds.json", "cannot read the DeepSpeed config file", also=DS)
    ],
    "zero_stage": [
        Reaches(
            3,
            accelerator_config("deepspeed_plugins.default.deepspeed_config.zero_optimization.stage"),
            3,
            also=DS,
        ),
        Refused(1, "--zero_stage has no effect without --use_deepspeed"),
    ],
    "offload_optimizer_device": [
        Reaches("cpu", deepspeed_plugin("offload_optimizer_device"), "cpu", also=DS)
    ],
    "offload_param_device": [Reaches("cpu", deepspeed_plugin("offload_param_device"), "cpu", also=DS)],
    "offload_optimizer_nvme_path": [
        Reaches("/nvme/o", deepspeed_plugin("offload_optimizer_nvme_path"), "/nvme/o", also=DS)
    ],
    "offload_param_nvme_path": [
        Reaches("/nvme/p", deepspeed_plugin("offload_param_nvme_path"), "/nvme/p", also=DS)
    ],
    "zero3_init_flag": [
        Reaches(False, deepspeed_plugin("zero3_init_flag"), False, also={**DS, "zero_stage": 3})
    ],
    "zero3_save_16bit_model": [Reaches(True, deepspeed_plugin("zero3_save_16bit_model"), True, also=DS)],
    "deepspeed_moe_layer_cls_names": [
        Reaches(
            "MixtralSparseMoeBlock",
            deepspeed_plugin("transformer_moe_cls_names"),
            "MixtralSparseMoeBlock",
            also=DS,
        )
    ],
    "deepspeed_hostfile": [Refused("/etc/hosts", NO_DS_RUNNER, also=DS)],
    "deepspeed_inclusion_filter": [Refused("node1", NO_DS_RUNNER, also=DS)],
    "deepspeed_exclusion_filter": [Refused("node2", NO_DS_RUNNER, also=DS)],
    "deepspeed_multinode_launcher": [
        NoEffect("torchrun's agent is the 'standard' launcher accelerando always uses", "standard", DS),
        Refused("pdsh", NO_DS_RUNNER, also=DS),
    ],
    "fsdp_version": [Reaches(1, lambda r, exported: settings_from_env(exported)["fsdp_version"], 1)],
    "fsdp_offload_params": [Reaches(True, fsdp_plugin("cpu_offload"), "CPUOffloadPolicy")],
    "fsdp_min_num_params": [Reaches(1000, fsdp_plugin("min_num_params"), 1000)],
    "fsdp_sharding_strategy": [Reaches("SHARD_GRAD_OP", fsdp_plugin("reshard_after_forward"), False)],
    "fsdp_reshard_after_forward": [Reaches("false", fsdp_plugin("reshard_after_forward"), False)],
    "fsdp_auto_wrap_policy": [Reaches("SIZE_BASED_WRAP", fsdp_plugin("auto_wrap_policy"), "size_based_wrap")],
    "fsdp_transformer_layer_cls_to_wrap": [
        Reaches("Block,Layer", fsdp_plugin("transformer_cls_names_to_wrap"), ["Block", "Layer"])
    ],
    "fsdp_backward_prefetch": [Reaches("BACKWARD_PRE", fsdp_plugin("backward_prefetch"), "BACKWARD_PRE")],
    "fsdp_state_dict_type": [Reaches("FULL_STATE_DICT", fsdp_plugin("state_dict_type"), "FULL_STATE_DICT")],
    "fsdp_forward_prefetch": [Reaches(True, fsdp_plugin("forward_prefetch"), True)],
    "fsdp_use_orig_params": [Reaches(True, fsdp_plugin("use_orig_params"), True)],
    "fsdp_cpu_ram_efficient_loading": [Reaches(True, fsdp_plugin("sync_module_states"), True)],
    "fsdp_sync_module_states": [Reaches(True, fsdp_plugin("sync_module_states"), True)],
    "fsdp_activation_checkpointing": [Reaches(True, fsdp_plugin("activation_checkpointing"), True)],
    "fsdp_ignored_modules": [Reaches("head", fsdp_plugin("ignored_modules"), "head")],
    "fp8_backend": [
        Reaches("ao", accelerator_config("handlers.fp8.backend"), "ao", also=FP8),
        Reaches("te", accelerator_config("fp8.requested"), "te", also=FP8, detected=H100),
        Reaches("msamp", accelerator_config("fp8.requested"), "msamp", also=FP8, detected=H100),
        Refused("te", "fp8 backend 'te' (Transformer Engine) cannot run here: it needs", also=FP8),
        Refused("msamp", "fp8 backend 'msamp' (MS-AMP) cannot run here: it needs", also=FP8),
    ],
    "fp8_use_autocast_during_eval": [
        Reaches(
            True, accelerator_config("handlers.fp8.use_autocast_during_eval"), True, also=TE, detected=H100
        )
    ],
    "fp8_margin": [Reaches(3, accelerator_config("handlers.fp8.margin"), 3, also=TE, detected=H100)],
    "fp8_interval": [Reaches(2, accelerator_config("handlers.fp8.interval"), 2, also=TE, detected=H100)],
    "fp8_format": [
        Reaches("E4M3", accelerator_config("handlers.fp8.fp8_format"), "E4M3", also=TE, detected=H100)
    ],
    "fp8_amax_history_len": [
        Reaches(16, accelerator_config("handlers.fp8.amax_history_len"), 16, also=TE, detected=H100)
    ],
    "fp8_amax_compute_algo": [
        Reaches("max", accelerator_config("handlers.fp8.amax_compute_algo"), "max", also=TE, detected=H100)
    ],
    "fp8_override_linear_precision": [
        Reaches(
            "(False, True, False)",
            accelerator_config("handlers.fp8.override_linear_precision"),
            (False, True, False),
            also=TE,
            detected=H100,
        )
    ],
    "fp8_opt_level": [
        Reaches("O1", accelerator_config("handlers.fp8.opt_level"), "O1", also=MSAMP, detected=H100)
    ],
    "fp8_enable_fsdp_float8_all_gather": [
        Reaches(True, accelerator_config("fp8.recipes.ao.enable_fsdp_float8_all_gather"), True, also=FP8)
    ],
    "fp8_pad_inner_dim": [Reaches(True, accelerator_config("fp8.recipes.ao.pad_inner_dim"), True, also=FP8)],
    "fp8_recipe_name": [
        Reaches("rowwise", accelerator_config("handlers.fp8.recipe_name"), "rowwise", also=AO)
    ],
}
_SAMPLE = {"switch": True, "bool": True, "int": 1, "float": 1.0, "str": "x"}
for _opt in OPTIONS:  # every other ParallelismConfig option: refused whatever its value
    if _opt.name not in ROWS and _opt.refused:
        sample = _opt.choices[0] if _opt.choices else _SAMPLE[_opt.kind]
        ROWS[_opt.name] = [Refused(sample, NO_PC)]

CASES = [
    pytest.param(name, row, id=f"{name}-{i}") for name, rows in ROWS.items() for i, row in enumerate(rows)
]


def test_every_option_has_a_row() -> None:
    assert sorted(set(BY_NAME) - set(ROWS)) == []
    assert sorted(set(ROWS) - set(BY_NAME)) == []


@pytest.mark.parametrize(("name", "row"), CASES)
def test_option_reaches_its_reader_or_is_refused(name: str, row: Reaches | Refused | NoEffect) -> None:
    if isinstance(row, NoEffect):
        r = launch({**row.also, name: row.value})
        assert r[name] == row.value and not BY_NAME[name].export  # accepted, handed to nobody
        return
    if isinstance(row, Refused):
        with pytest.raises(ValueError, match=f"--{name}") as err:
            launch({**row.also, name: row.value})
        assert row.message in str(err.value)
        return
    if row.needs and importlib.util.find_spec(row.needs) is None:
        pytest.skip(f"needs {row.needs}")
    r = launch({**row.also, name: row.value}, row.detected)
    exported = child_exports(r, row.detected.device_type)
    seen = row.read(r, exported)
    if isinstance(row.expected, str) and not isinstance(seen, str) and seen is not None:
        seen = type(seen).__name__  # a policy object: compare its type's name
    assert seen == row.expected


def test_deepspeed_from_a_config_file_or_the_environment_reaches_the_process(tmp_path: Path) -> None:
    """Accelerate's DEEPSPEED config file and ACCELERATE_USE_DEEPSPEED both give each process a plugin."""
    from accelerando.config.yaml_config import load_config

    path = tmp_path / "ds.yaml"
    path.write_text(
        "distributed_type: DEEPSPEED\nmixed_precision: 'no'\nnum_processes: 2\ndeepspeed_config:\n"
        "  zero_stage: 3\n  offload_param_device: cpu\n  zero3_init_flag: false\n"
        "  gradient_accumulation_steps: 4\n  deepspeed_multinode_launcher: standard\n"
    )
    r = resolve({}, {}, load_config(path), CPU)
    assert r["use_deepspeed"] is True and "distributed_type: DEEPSPEED" in r.sources["use_deepspeed"]
    exported = child_exports(r, "cpu")
    plugin = accelerator_config("deepspeed_plugins.default")(r, exported)
    assert (plugin.zero_stage, plugin.offload_param_device, plugin.zero3_init_flag) == (3, "cpu", False)
    assert accelerator_config("gradient.num_steps")(r, exported) == 4
    assert accelerator_config("use_deepspeed")(launch({}), {"ACCELERATE_USE_DEEPSPEED": "true"}) is True
    assert resolve({}, {"ACCELERATE_USE_DEEPSPEED": "false"}, None, CPU)["use_deepspeed"] is False
    with pytest.raises(
        ValueError, match=r"parallelism_config_tp_size \(from env PARALLELISM_CONFIG_TP_SIZE\)"
    ):
        resolve({}, {"PARALLELISM_CONFIG_TP_SIZE": "2"}, None, CPU)


def test_deepspeed_settings_are_checked_at_launch_as_each_process_will(tmp_path: Path) -> None:
    """A config file contradicting a flag, precision or accumulation stops the launch, naming both."""
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(
        '{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}, "gradient_accumulation_steps": 4}'
    )
    base = {**DS, "deepspeed_config_file": str(ds_json)}
    assert launch(base)["deepspeed_config_file"] == str(ds_json)  # agreeing settings launch
    for cli, message in [
        (
            {"zero_stage": 3},
            "DeepSpeedPlugin zero_stage=3 contradicts the DeepSpeed config's zero_optimization.stage=2",
        ),
        (
            {"mixed_precision": "fp16"},
            "mixed_precision='fp16' (--mixed_precision) contradicts DeepSpeed plugin",
        ),
        (
            {"gradient_accumulation_steps": 2},
            "gradient_accumulation_steps=2 contradicts the DeepSpeed config's gradient_accumulation_steps=4",
        ),
        ({"use_fsdp": True}, "--use_deepspeed and --use_fsdp exclude each other"),
    ]:
        with pytest.raises(ValueError) as err:
            launch({**base, **cli})
        assert message in str(err.value), err.value
    ds_json.write_text("{not json")
    with pytest.raises(ValueError, match=r"--deepspeed_config_file: .* is not valid JSON"):
        launch(base)


def test_a_process_told_to_use_an_unknown_fp8_backend_refuses() -> None:
    with pytest.raises(
        ValueError, match=r"fp8 backend 'fp4' \(ACCELERANDO_FP8_BACKEND\) is unknown; accepted: ao, te"
    ):
        accelerator_config("cpu")(
            launch({}), {"ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_BACKEND": "FP4"}
        )


BAD_VALUES = [
    ({"gradient_accumulation_steps": 0}, "--gradient_accumulation_steps: gradient_accumulation_steps=0 must be at least 1"),
    ({"num_processes": 0}, "num_processes=0 must be at least 1"),
    ({"num_machines": -3}, "num_machines=-3 must be at least 1"),
    ({"nproc_per_node": 0}, "nproc_per_node=0 must be at least 1"),
    ({"main_process_port": 70000}, "main_process_port=70000 must be between 1 and 65535"),
    ({"max_restarts": -1}, "max_restarts=-1 must be at least 0"),
    ({"num_cpu_threads_per_process": 0}, "num_cpu_threads_per_process=0 must be at least 1"),
    ({"mixed_precision": "fp64"}, "mixed_precision='fp64' is not one of no, fp16, bf16, fp8"),
    ({"dynamo_backend": "warp_drive"}, "dynamo_backend='warp_drive' is not one of no, eager"),
    ({"dynamo_mode": "fastest"}, "dynamo_mode='fastest' is not one of default"),
    ({"fsdp_version": 3}, "--fsdp_version: fsdp_version must be 1 or 2, got 3"),
    ({"fsdp_state_dict_type": "BOGUS"}, "--fsdp_state_dict_type: state_dict_type 'BOGUS' unknown; accepted:"),
    ({"fsdp_sharding_strategy": "HALF"}, "--fsdp_sharding_strategy: unknown sharding_strategy 'HALF'; accepted:"),
    ({"fsdp_sharding_strategy": "NO_SHARD"}, "NO_SHARD' has no FSDP2 form"),
    ({"fsdp_auto_wrap_policy": "EVERYTHING"}, "--fsdp_auto_wrap_policy: auto_wrap_policy 'EVERYTHING' unknown"),
    ({"fsdp_backward_prefetch": "SOMETIMES"}, "--fsdp_backward_prefetch: backward_prefetch 'SOMETIMES' unknown"),
    ({"fsdp_reshard_after_forward": "maybe"}, "--fsdp_reshard_after_forward: unknown sharding_strategy 'MAYBE'"),
    ({"fsdp_ignored_modules": "head("}, "--fsdp_ignored_modules: ignored_modules 'head(' is not a regular expression"),
    ({"fsdp_min_num_params": -1}, "fsdp_min_num_params=-1 must be at least 0"),
    ({"fsdp_offload_params": "perhaps"}, "'perhaps' is not a valid bool for fsdp_offload_params"),
    ({"fsdp_cpu_ram_efficient_loading": True, "fsdp_sync_module_states": False}, "needs sync_module_states=True"),
    ({"tee": "7"}, "--tee '7' must be 0, 1, 2 or 3"),
    ({"rdzv_conf": "read_timeout=soon"}, "--rdzv_conf read_timeout='soon' must be a number of seconds"),
    ({"main_process_ip": "10.0.0.1 10.0.0.2", "num_machines": 2, "num_processes": 2}, "is not a host name"),
    ({"fp8_pad_inner_dim": True, "mixed_precision": "bf16"}, "--fp8_pad_inner_dim has no effect with --mixed_precision=bf16"),
]  # fmt: skip


@pytest.mark.parametrize(("cli", "message"), BAD_VALUES, ids=[next(iter(c)) for c, _ in BAD_VALUES])
def test_bad_values_are_refused_naming_option_value_and_accepted(cli: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        launch(cli)
    assert message in str(err.value)


def test_fp8_needs_torchao_and_compile_backends_must_exist() -> None:
    with pytest.raises(ValueError, match=r"mixed_precision=fp8: .*torchao needs the 'torchao' package"):
        launch({"mixed_precision": "fp8"}, dataclasses.replace(CPU, fp8_packages=frozenset()))
    with pytest.raises(
        ValueError, match="dynamo_backend=tvm: this torch has no compile backend of that name"
    ):
        launch({"dynamo_backend": "tvm"}, compile_backends=lambda: ["inductor", "eager"])
    asked: list[bool] = []
    launch({"dynamo_backend": "inductor"}, compile_backends=lambda: asked.append(True) or [])
    assert asked == []  # built-in backends need no lookup (importing torch._dynamo takes seconds)


def test_cli_refuses_with_exit_code_2_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelerando.commands.main import main
    from accelerando.launch import torchrun

    def no_launch(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("a process was started")

    monkeypatch.setattr(torchrun, "run", no_launch)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    for argv, message in [
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps=0 must be at least 1"),
        (["--zero_stage", "5", "--use_deepspeed"], "--zero_stage: zero_stage=5 must be between 0 and 3"),
        (
            ["--fp8_backend", "te", "--mixed_precision", "fp8"],
            "--fp8_backend=te: fp8 backend 'te' (Transformer",
        ),
        (["--fsdp_state_dict_type", "LOCAL_STATE_DICT"], "LOCAL_STATE_DICT is FSDP1's flat-parameter format"),
        (["--enable_cpu_affinity", "--no_python"], "--enable_cpu_affinity pins Python processes"),
        (["--as_accelerate", "--no_python"], "--as_accelerate turns the switch on in accelerando's worker"),
    ]:
        assert main(["launch", "--cpu", *argv, str(script)]) == 2
        err = capsys.readouterr().err
        assert "accelerando launch: error:" in err and message in err, err


def test_core_share_splits_cores_contiguously() -> None:
    cores = [0, 1, 2, 3, 4, 5, 6]
    shares = [worker.core_share(cores, rank, 3) for rank in range(3)]
    assert shares == [[0, 1], [2, 3], [4, 5, 6]]
    assert [worker.core_share([4, 9], rank, 3) for rank in range(3)] == [[4], [9], [4]]
    assert worker.pin_to_core_share({"LOCAL_RANK": "0"}) is None  # off unless asked
    with pytest.raises(ValueError, match="local rank 3 of 3"):
        worker.core_share(cores, 3, 3)


def test_a_parallelism_config_block_in_the_config_file_reaches_the_accelerator(tmp_path: Path) -> None:
    """Accelerate's YAML block: its presence turns the config on, as Accelerate's launcher does."""
    from accelerando.config.yaml_config import load_config

    path = tmp_path / "config.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
        "parallelism_config:\n  parallelism_config_dp_replicate_size: 1\n  parallelism_config_tp_size: 2\n"
    )
    r = resolve({}, {}, load_config(path), CPU, free_port=lambda: 29400)
    exported = child_exports(r, "cpu")
    assert exported["PARALLELISM_CONFIG_TP_SIZE"] == "2" and r["use_parallelism_config"] is True
    assert accelerator_config("parallelism.tp_size")(r, exported) == 2
