"""Every `accelerando launch` setting, described once as data.

One table drives the argument parser, the config-file keys, the environment variable that can set a
value, the one exported to the training processes, the range a number must lie in and, for what
accelerando cannot do yet, the refusal naming the issue that adds it. Adding a setting is adding a
row (and a row in tests/unit/launch/test_flags_reach_their_reader.py, which fails until it has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from accelerando.config.options import DynamoBackend

# Option kinds: "switch" (store_true flag), "bool" (takes true/false), "int", "float", "str".
KINDS = ("switch", "bool", "int", "float", "str")


@dataclass(frozen=True)
class Option:
    """One launch setting: CLI flag `--name`, config-file key(s), environment variable."""

    name: str
    kind: str
    group: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    yaml: tuple[str, ...] = ()  # dotted keys in an Accelerate config file, first is canonical
    env: str | None = None  # full variable name; `ACCELERANDO_*` is also read as `ACCELERATE_*`
    export: bool = False  # written for the training processes when set
    lower: bool = False  # compare choices case-insensitively and store lower-case
    short: str | None = None  # an extra one-dash spelling, e.g. "-t"
    minimum: float | None = None  # numbers: smallest accepted value
    maximum: float | None = None  # numbers: largest accepted value
    refused: str | None = None  # why any use of the setting stops the launch (what is missing)
    # values accepted by the parser but refused with a reason (e.g. fp8 backends not available yet)
    refused_values: Mapping[str, str] = field(default_factory=dict, compare=False)


def _o(name: str, kind: str, group: str, help: str, **kw: Any) -> Option:
    kw.setdefault("yaml", (name,))
    kw.setdefault("env", "ACCELERANDO_" + name.upper())
    return Option(name=name, kind=kind, group=group, help=help, **kw)


def _feature(
    prefix_env: str, yaml_section: str, name: str, kind: str, group: str, help: str, **kw: Any
) -> Option:
    """A setting read by a feature (FSDP, DeepSpeed, ...) from the environment of each process."""
    key = kw.pop("key", name)
    env_name = kw.pop("env_name", prefix_env + key.upper().removeprefix(group.upper() + "_"))
    kw.setdefault("yaml", (f"{yaml_section}.{key}",))
    kw.setdefault("export", True)
    return Option(name=name, kind=kind, group=group, help=help, env=env_name, **kw)


GENERAL = "General"
HARDWARE = "Hardware selection"
RESOURCE = "Resource selection"
PARADIGM = "Training paradigm"
DISTRIBUTED = "Distributed (single and multi node)"
DEEPSPEED = "DeepSpeed"
FSDP = "FSDP"
FP8 = "FP8"
PARALLEL = "ParallelismConfig"

# What TorchDynamoPlugin accepts (Accelerate's names), spelled as Accelerate's launcher takes them.
DYNAMO_BACKENDS = tuple(name.lower() for name in DynamoBackend.list())

NO_DEEPSPEED_RUNNER = (
    "accelerando starts every machine's processes with torchrun's agent (--num_machines, --machine_rank, "
    "--main_process_ip); DeepSpeed's own multi-node runner (hostfile, include/exclude filters) is not used"
)
NO_SEQUENCE_PARALLEL = (
    "sequence parallelism (Accelerate's DeepSpeed ALST/Ulysses) is not available yet in accelerando; "
    "dp_replicate_size, dp_shard_size, tp_size and cp_size are"
)

_CORE: list[Option] = [
    _o("debug", "switch", GENERAL, "check collectives across ranks (sets ACCELERANDO_DEBUG_MODE) and show launcher logs",
       env="ACCELERANDO_DEBUG_MODE", export=True),
    _o("cpu", "switch", HARDWARE, "run on CPU only (gloo), even when an accelerator is present",
       yaml=("use_cpu",), env="ACCELERANDO_USE_CPU", export=True),
    _o("as_accelerate", "switch", GENERAL, "in the training processes `import accelerate` gives accelerando's "
       "modules and the `accelerate` command runs accelerando's (accelerando.as_accelerate())", export=True),
    _o("multi_gpu", "switch", HARDWARE, "use the machine's accelerators (Accelerate's flag; implied by default)",
       yaml=(), env=None),
    _o("tpu", "switch", HARDWARE, "TPU launching (not supported: use torch_xla's launcher)", yaml=(), env=None,
       refused="accelerando does not launch TPU/XLA pods (use torch_xla's launcher)"),
    _o("mixed_precision", "str", RESOURCE, "mixed precision mode", choices=("no", "fp16", "bf16", "fp8"),
       default="no", export=True, lower=True),
    _o("num_processes", "int", RESOURCE, "total processes over all machines (Accelerate's meaning)", minimum=1),
    _o("nproc_per_node", "int", RESOURCE, "processes on this machine (default: num_processes / num_machines); "
       "may differ between machines", minimum=1),
    _o("num_machines", "int", RESOURCE, "number of machines (nodes)", default=1, minimum=1),
    _o("num_cpu_threads_per_process", "int", RESOURCE, "OMP_NUM_THREADS for each process "
       "(default on CPU: cores / local processes)", env="OMP_NUM_THREADS", export=True, minimum=1),
    _o("enable_cpu_affinity", "switch", RESOURCE, "pin each local process to its own contiguous share of the "
       "cores this launcher may use (Linux)", env="ACCELERANDO_CPU_AFFINITY", export=True),
    _o("dynamo_backend", "str", RESOURCE, "torch.compile backend ('no' disables)", choices=DYNAMO_BACKENDS,
       default="no", yaml=("dynamo_config.dynamo_backend", "dynamo_backend"), export=True, lower=True),
    _o("dynamo_mode", "str", RESOURCE, "torch.compile mode",
       choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
       yaml=("dynamo_config.dynamo_mode",), export=True),
    _o("dynamo_use_fullgraph", "switch", RESOURCE, "torch.compile(fullgraph=True)",
       yaml=("dynamo_config.dynamo_use_fullgraph",), export=True),
    _o("dynamo_use_dynamic", "switch", RESOURCE, "torch.compile(dynamic=True)",
       yaml=("dynamo_config.dynamo_use_dynamic",), export=True),
    _o("dynamo_use_regional_compilation", "switch", RESOURCE, "compile repeated blocks once",
       yaml=("dynamo_config.dynamo_use_regional_compilation",), export=True),
    _o("use_deepspeed", "switch", PARADIGM, "train with DeepSpeed (ZeRO stages 0-3)", yaml=(), export=True),
    _o("use_fsdp", "switch", PARADIGM, "train with FSDP", yaml=(), export=True),
    _o("use_parallelism_config", "switch", PARADIGM, "build a ParallelismConfig from --parallelism_config_* "
       "(implied by any of them or by a parallelism_config block in the config file)", yaml=(), export=True),
    _o("use_megatron_lm", "switch", PARADIGM, "Megatron-LM (not supported by accelerando)", yaml=(), env=None,
       refused="accelerando does not launch Megatron-LM"),
    _o("gpu_ids", "str", DISTRIBUTED, "accelerator ids for this machine, 'all' or e.g. '0,1' "
       "(sets CUDA_VISIBLE_DEVICES or the device's equivalent)", env=None),
    _o("same_network", "switch", DISTRIBUTED, "all machines share a local network (accepted; torchrun's "
       "rendezvous needs no such hint)"),
    _o("machine_rank", "int", DISTRIBUTED, "rank of this machine, 0 is the main one", default=0, minimum=0),
    _o("main_process_ip", "str", DISTRIBUTED, "address of machine 0 (required with --num_machines > 1)"),
    _o("main_process_port", "int", DISTRIBUTED, "rendezvous port on machine 0 (single machine: a free one; "
       "multi-machine: 29500)", minimum=1, maximum=65535),
    _o("tee", "str", DISTRIBUTED, "also write stdout/stderr to --log_dir: 0 none, 1 stdout, 2 stderr, 3 both",
       default="0", short="-t"),
    _o("log_dir", "str", DISTRIBUTED, "folder for the per-rank logs"),
    _o("role", "str", DISTRIBUTED, "name of the worker group", default="default"),
    _o("rdzv_backend", "str", DISTRIBUTED, "rendezvous: c10d (reliable restarts, default) or static",
       default="c10d", choices=("c10d", "static")),
    _o("rdzv_conf", "str", DISTRIBUTED, "extra rendezvous settings 'k1=v1,k2=v2' (join_timeout, read_timeout, "
       "timeout, last_call_timeout, close_timeout)", default=""),
    _o("max_restarts", "int", DISTRIBUTED, "restart the whole worker group up to N times after a failure",
       default=0, minimum=0),
    _o("monitor_interval", "float", DISTRIBUTED, "seconds between health checks of the workers", default=0.1),
]  # fmt: skip


def _ds(name: str, kind: str, help: str, **kw: Any) -> Option:
    return _feature("ACCELERANDO_DEEPSPEED_", "deepspeed_config", name, kind, DEEPSPEED, help, **kw)


_DEEPSPEED: list[Option] = [
    _ds("deepspeed_config_file", "str", "DeepSpeed JSON config file", env_name="ACCELERANDO_DEEPSPEED_CONFIG_FILE"),
    _ds("zero_stage", "int", "ZeRO stage 0-3 (default 2)", minimum=0, maximum=3),
    _ds("offload_optimizer_device", "str", "optimizer state offload", choices=("none", "cpu", "nvme"), lower=True),
    _ds("offload_param_device", "str", "parameter offload (ZeRO-3)", choices=("none", "cpu", "nvme"), lower=True),
    _ds("offload_optimizer_nvme_path", "str", "NVMe path for optimizer offload"),
    _ds("offload_param_nvme_path", "str", "NVMe path for parameter offload"),
    _ds("gradient_accumulation_steps", "int", "gradient accumulation steps (all strategies read it)",
        env_name="ACCELERANDO_GRADIENT_ACCUMULATION_STEPS", minimum=1),
    _ds("gradient_clipping", "float", "DeepSpeed's gradient clipping (default: clip when clip_grad_norm_ asks)",
        env_name="ACCELERANDO_GRADIENT_CLIPPING", minimum=0),
    _ds("zero3_init_flag", "bool", "build ZeRO-3 transformers models partitioned (zero.Init)",
        env_name="ACCELERANDO_DEEPSPEED_ZERO3_INIT"),
    _ds("zero3_save_16bit_model", "bool", "ZeRO-3: gather 16-bit weights when saving the model"),
    _ds("deepspeed_hostfile", "str", "DeepSpeed runner hostfile (not used: torchrun starts the processes)",
        env_name="ACCELERANDO_DEEPSPEED_HOSTFILE", refused=NO_DEEPSPEED_RUNNER),
    _ds("deepspeed_exclusion_filter", "str", "DeepSpeed runner exclusion filter (not used)",
        env_name="ACCELERANDO_DEEPSPEED_EXCLUSION_FILTER", refused=NO_DEEPSPEED_RUNNER),
    _ds("deepspeed_inclusion_filter", "str", "DeepSpeed runner inclusion filter (not used)",
        env_name="ACCELERANDO_DEEPSPEED_INCLUSION_FILTER", refused=NO_DEEPSPEED_RUNNER),
    _ds("deepspeed_multinode_launcher", "str", "multi-node runner: only 'standard' (torchrun) is used",
        choices=("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"), export=False,
        env_name=None, refused_values={k: NO_DEEPSPEED_RUNNER for k in ("pdsh", "openmpi", "mvapich", "mpich",
                                                                       "nossh", "slurm")}),
    _ds("deepspeed_moe_layer_cls_names", "str", "MoE layer class names, comma separated (ZeRO-3 leaf modules)",
        env_name="ACCELERANDO_DEEPSPEED_MOE_LAYER_CLS_NAMES"),
]  # fmt: skip


def _fsdp(name: str, kind: str, help: str, **kw: Any) -> Option:
    return _feature("FSDP_", "fsdp_config", name, kind, FSDP, help, **kw)


_FSDP: list[Option] = [
    _fsdp("fsdp_version", "int", "FSDP version: 1 (FullyShardedDataParallel) or 2 (fully_shard)"),
    _fsdp("fsdp_offload_params", "bool", "offload parameters and gradients to CPU"),
    _fsdp("fsdp_min_num_params", "int", "minimum parameters for size-based auto wrap", minimum=0),
    _fsdp("fsdp_sharding_strategy", "str", "FSDP1 sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, ...)"),
    _fsdp("fsdp_reshard_after_forward", "str", "FSDP2: true/false (or an FSDP1 strategy name)"),
    _fsdp("fsdp_auto_wrap_policy", "str", "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP"),
    _fsdp("fsdp_transformer_layer_cls_to_wrap", "str", "layer class names to wrap, comma separated",
          env_name="FSDP_TRANSFORMER_CLS_TO_WRAP"),
    _fsdp("fsdp_backward_prefetch", "str", "FSDP1 backward prefetch (BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH)"),
    _fsdp("fsdp_state_dict_type", "str", "FULL_STATE_DICT or SHARDED_STATE_DICT"),
    _fsdp("fsdp_forward_prefetch", "bool", "FSDP1 forward prefetch"),
    _fsdp("fsdp_use_orig_params", "bool", "FSDP1 use_orig_params"),
    _fsdp("fsdp_cpu_ram_efficient_loading", "bool", "load weights on rank 0 only, then broadcast"),
    _fsdp("fsdp_sync_module_states", "bool", "FSDP1: broadcast module states from rank 0"),
    _fsdp("fsdp_activation_checkpointing", "bool", "checkpoint activations of wrapped layers"),
    _fsdp("fsdp_ignored_modules", "str", "module names FSDP leaves alone"),
]  # fmt: skip


def _fp8(name: str, kind: str, help: str, keys: tuple[str, ...], **kw: Any) -> Option:
    return Option(name=name, kind=kind, group=FP8, help=help, yaml=tuple(f"fp8_config.{k}" for k in keys),
                  env="ACCELERANDO_" + name.upper(), export=True, **kw)  # fmt: skip


_FP8: list[Option] = [
    _fp8("fp8_backend", "str", "FP8 backend: ao (torchao), te (Transformer Engine) or msamp (MS-AMP); "
         "default: the one that can run here (te, msamp, then ao)", ("backend",), choices=("ao", "te", "msamp"),
         lower=True),
    _fp8("fp8_use_autocast_during_eval", "switch", "TE: keep FP8 autocast during evaluation",
         ("use_autocast_during_eval",)),
    _fp8("fp8_margin", "int", "TE scaling margin", ("margin",)),
    _fp8("fp8_interval", "int", "TE scaling-factor update interval", ("interval",)),
    _fp8("fp8_format", "str", "TE FP8 format", ("fp8_format",), choices=("HYBRID", "E4M3", "E5M2")),
    _fp8("fp8_amax_history_len", "int", "TE amax history length", ("amax_history_len", "amax_history_length")),
    _fp8("fp8_amax_compute_algo", "str", "TE amax algorithm", ("amax_compute_algo", "amax_compute_algorithm"),
         choices=("max", "most_recent")),
    _fp8("fp8_override_linear_precision", "str", "TE '(fprop, dgrad, wgrad)' higher-precision overrides",
         ("override_linear_precision",)),
    _fp8("fp8_opt_level", "str", "MS-AMP level", ("opt_level", "optimization_level"), choices=("O1", "O2")),
    _fp8("fp8_enable_fsdp_float8_all_gather", "bool", "torchao: FP8 all-gather under FSDP2",
         ("enable_fsdp_float8_all_gather",)),
    _fp8("fp8_pad_inner_dim", "bool", "torchao: pad inner dimensions", ("pad_inner_dim",)),
    _fp8("fp8_recipe_name", "str", "torchao: Float8LinearConfig recipe", ("recipe_name",),
         choices=("tensorwise", "rowwise", "rowwise_with_gw_hp"), lower=True),
]  # fmt: skip


def _pc(name: str, kind: str, help: str, **kw: Any) -> Option:
    full = "parallelism_config_" + name
    return Option(name=full, kind=kind, group=PARALLEL, help=help, yaml=(f"parallelism_config.{full}",),
                  env=full.upper(), export=True, **kw)  # fmt: skip


_PARALLEL: list[Option] = [
    _pc("dp_replicate_size", "int", "data-parallel replicas (DDP, or the HSDP outer dimension)", minimum=1),
    _pc("dp_shard_size", "int", "data-parallel shards (FSDP dimension; needs --use_fsdp)", minimum=1),
    _pc("tp_size", "int", "tensor-parallel size", minimum=1),
    _pc("cp_size", "int", "context-parallel size (needs --use_fsdp)", minimum=1),
    _pc("cp_backend", "str", "context-parallel backend", choices=("torch",)),
    _pc("cp_comm_strategy", "str", "context-parallel rotation", choices=("allgather", "alltoall")),
    _pc("sp_size", "int", "sequence-parallel size", refused=NO_SEQUENCE_PARALLEL),
    _pc("sp_backend", "str", "sequence-parallel backend", choices=("deepspeed",), refused=NO_SEQUENCE_PARALLEL),
    _pc("sp_seq_length", "int", "sequence length for sequence parallelism", refused=NO_SEQUENCE_PARALLEL),
    _pc("sp_seq_length_is_variable", "bool", "sequence length varies between batches",
        refused=NO_SEQUENCE_PARALLEL),
    _pc("sp_attn_implementation", "str", "attention implementation for sequence parallelism",
        refused=NO_SEQUENCE_PARALLEL),
]  # fmt: skip

OPTIONS: tuple[Option, ...] = tuple(_CORE + _DEEPSPEED + _FSDP + _FP8 + _PARALLEL)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
assert len(BY_NAME) == len(OPTIONS), "duplicate option names"
assert all(o.kind in KINDS for o in OPTIONS)
assert all(set(o.refused_values) <= set(o.choices or ()) for o in OPTIONS)
