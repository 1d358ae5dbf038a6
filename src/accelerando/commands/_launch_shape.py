"""The shape of the Namespace Accelerate's `launch_command_parser` returns, for code written against it.

`accelerando launch` leaves a flag nobody typed out of its Namespace; Accelerate's parser fills
every field with a default instead, and some of its types differ (`--fsdp_version` is the text
'2'). `commands.launch.launch_command_parser` builds accelerando's flags with these defaults and
types, plus the flags only Accelerate's launcher has: they parse, and are ignored outside their
platform (TPU pods, Megatron-LM, SageMaker), which accelerando's launcher refuses, as Accelerate
ignores them there too. Which fields were typed is kept in `args.nondefault`, as Accelerate does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from accelerando.commands._args import add_flag


def str_to_bool(text: str) -> int:
    """Accelerate's reading of a yes/no flag value: 1 or 0."""
    value = text.lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return 1
    if value in ("n", "no", "f", "false", "off", "0"):
        return 0
    raise ValueError(f"invalid truth value {text!r}; answer yes/no, true/false, on/off or 1/0")


def _bools(text: str) -> tuple[bool, ...]:
    return tuple(bool(str_to_bool(part)) for part in text.split(","))


# Options of accelerando's table whose default in Accelerate's Namespace is not None (switches: False).
DEFAULTS: dict[str, Any] = {
    "debug": None, "dynamo_use_dynamic": None,
    "dynamo_mode": "default", "tee": "0", "role": "default", "rdzv_backend": "static", "rdzv_conf": "",
    "max_restarts": 0, "monitor_interval": 0.1, "fsdp_version": "1", "fsdp_offload_params": "false",
    "fsdp_min_num_params": 100_000_000, "fsdp_sharding_strategy": "FULL_SHARD",
    "fsdp_reshard_after_forward": "true", "fsdp_forward_prefetch": "false", "fsdp_use_orig_params": "true",
    "fsdp_cpu_ram_efficient_loading": "true", "fsdp_sync_module_states": "true",
    "fsdp_activation_checkpointing": "false", "fp8_margin": 0, "fp8_interval": 1, "fp8_format": "HYBRID",
    "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "most_recent",
    "fp8_override_linear_precision": (False, False, False), "fp8_enable_fsdp_float8_all_gather": "true",
    "fp8_pad_inner_dim": "true", "parallelism_config_dp_replicate_size": 1,
    "parallelism_config_dp_shard_size": 1, "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1,
    "parallelism_config_cp_backend": "torch", "parallelism_config_cp_comm_strategy": "allgather",
    "parallelism_config_sp_size": 1, "parallelism_config_sp_backend": "deepspeed",
    "parallelism_config_sp_seq_length_is_variable": True, "parallelism_config_sp_attn_implementation": "sdpa",
}  # fmt: skip

# Options whose value type in Accelerate's Namespace differs from accelerando's reading of them.
TYPES: dict[str, Callable[[str], Any]] = {
    "fsdp_version": str,
    "fp8_override_linear_precision": _bools,
    "fp8_enable_fsdp_float8_all_gather": str_to_bool,
    "fp8_pad_inner_dim": str_to_bool,
    "parallelism_config_sp_seq_length_is_variable": bool,
}
CHOICES: dict[str, Sequence[str]] = {"fsdp_version": ("1", "2")}

_MEGATRON: dict[str, tuple[Callable[[str], Any], Any]] = {
    "tp_degree": (int, 1), "use_custom_fsdp": (bool, False), "no_load_optim": (bool, False),
    "eod_mask_loss": (bool, False), "overlap_cpu_optimizer_d2h_h2d": (bool, False),
    "no_save_optim": (bool, False), "optimizer_cpu_offload": (bool, False),
    "use_precision_aware_optimizer": (bool, False), "decoder_last_pipeline_num_layers": (int, None),
    "pp_degree": (int, 1), "num_micro_batches": (int, None), "sequence_parallelism": (str, None),
    "recompute_activations": (str, None), "use_distributed_optimizer": (str, None),
    "gradient_clipping": (float, 1.0), "recompute_granularity": (str, None), "recompute_method": (str, None),
    "recompute_num_layers": (int, None), "attention_backend": (str, None),
    "expert_model_parallel_size": (int, None), "context_parallel_size": (int, None),
    "attention_dropout": (float, None), "hidden_dropout": (float, None),
    "attention_softmax_in_fp32": (str, None), "expert_tensor_parallel_size": (int, None),
    "calculate_per_token_loss": (str, None), "use_rotary_position_embeddings": (str, None),
}  # fmt: skip

# Flags only Accelerate's launcher has, that take a value: name -> (type, default).
ONLY_ACCELERATE: dict[str, tuple[Callable[[str], Any], Any]] = {
    "main_training_function": (str, None),
    "fsdp_activation_checkpointing_offload": (str, "false"),
    "aws_access_key_id": (str, None),
    "aws_secret_access_key": (str, None),
    "mpirun_hostfile": (str, None),
    **{f"megatron_lm_{name}": spec for name, spec in _MEGATRON.items()},
}
ONLY_ACCELERATE_SWITCHES = ("tpu_use_sudo", "downcast_bf16")
ONLY_ACCELERATE_LISTS = ("vm", "env")


def _typed(action: type[argparse.Action]) -> type[argparse.Action]:
    """`action` that also notes its field in `namespace.nondefault` (Accelerate's record of typed flags)."""

    class Typed(action):  # type: ignore[valid-type, misc]
        def __call__(
            self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None
        ) -> None:
            super().__call__(parser, namespace, values, option)
            if not hasattr(namespace, "nondefault"):
                namespace.nondefault = set()
            namespace.nondefault.add(self.dest)

    return Typed


STORE = _typed(argparse._StoreAction)
STORE_TRUE = _typed(argparse._StoreTrueAction)
STORE_FALSE = _typed(argparse._StoreFalseAction)
APPEND = _typed(argparse._AppendAction)


def add_accelerate_only(parser: argparse.ArgumentParser) -> None:
    """The flags only Accelerate's launcher has (TPU pods, Megatron-LM, SageMaker, mpirun)."""
    group = parser.add_argument_group("Accelerate only", "accepted for Accelerate's command lines")
    add_flag(group, "tpu_cluster", action=STORE_TRUE, dest="tpu_use_cluster", help="TPU pods (refused)")
    add_flag(group, "no_tpu_cluster", action=STORE_FALSE, dest="tpu_use_cluster", help="TPU pods (refused)")
    for name in ONLY_ACCELERATE_SWITCHES:
        add_flag(group, name, action=STORE_TRUE, help="TPU only (ignored: accelerando does not launch TPUs)")
    for name in ONLY_ACCELERATE_LISTS:
        add_flag(group, name, action=APPEND, type=str, help="TPU pods only (ignored)")
    for name, (kind, default) in ONLY_ACCELERATE.items():
        add_flag(group, name, action=STORE, type=kind, default=default, help="Accelerate's launcher only")


def typed_fields(args: argparse.Namespace, defaults: dict[str, Any]) -> set[str]:
    """The fields the user typed: `args.nondefault` when the parser kept it, else those that differ
    from the parser's default (a Namespace built by hand)."""
    if hasattr(args, "nondefault"):
        return set(args.nondefault)
    return {k for k, v in vars(args).items() if k in defaults and v != defaults[k]}
