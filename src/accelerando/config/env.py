"""The one place that reads and writes environment variables.

The launcher hands settings to the processes it starts through `ACCELERANDO_*` variables; each
name is also accepted with the `ACCELERATE_` prefix so existing cluster scripts keep working.
Everything else in the library asks this module, never `os.environ`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field

PREFIX = "ACCELERANDO_"
ALIAS_PREFIX = "ACCELERATE_"
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def snapshot() -> dict[str, str]:
    """A copy of the process environment, for pure functions (cluster detection, config resolution)."""
    return dict(os.environ)


def lookup(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Value of `ACCELERANDO_<name>`, else `ACCELERATE_<name>`, else None."""
    env = os.environ if env is None else env
    for key in (PREFIX + name, ALIAS_PREFIX + name):
        if key in env:
            return env[key]
    return None


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Value of an un-prefixed variable (RANK, FSDP_VERSION, SLURM_PROCID, ...)."""
    env = os.environ if env is None else env
    return env.get(name)


def parse_bool(value: str, name: str) -> bool:
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(
        f"environment variable {name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no"
    )


def flag(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    value = lookup(name, env)
    return default if value is None else parse_bool(value, PREFIX + name)


def integer(name: str, default: int | None = None, env: Mapping[str, str] | None = None) -> int | None:
    value = lookup(name, env)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {PREFIX + name}={value!r} is not an integer") from None


@dataclass(frozen=True)
class EnvSettings:
    """What a launcher (ours or Accelerate's) asked of this process."""

    use_cpu: bool = False
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    dynamo_backend: str | None = None
    dynamo_mode: str | None = None
    dynamo_fullgraph: bool | None = None
    dynamo_dynamic: bool | None = None
    dynamo_regional: bool | None = None
    use_fsdp: bool = False
    use_deepspeed: bool = False
    use_parallelism_config: bool = False
    parallelism_variables: Mapping[str, str] = field(
        default_factory=dict
    )  # PARALLELISM_CONFIG_*, prefix removed
    deepspeed_variables: Mapping[str, str] = field(default_factory=dict)  # ACCELERANDO_DEEPSPEED_* and co.
    fp8_backend: str | None = None
    fp8_pad_inner_dim: bool | None = None
    fp8_enable_fsdp_float8_all_gather: bool | None = None
    fp8_use_autocast_during_eval: bool | None = None
    fp8_margin: int | None = None
    fp8_interval: int | None = None
    fp8_format: str | None = None
    fp8_amax_history_len: int | None = None
    fp8_amax_compute_algo: str | None = None
    fp8_override_linear_precision: tuple[bool, bool, bool] | None = None
    fp8_opt_level: str | None = None
    fp8_recipe_name: str | None = None
    torch_device: str | None = None
    debug_mode: bool = False
    enable_rich: bool = False
    log_level: str | None = None
    fork_launched: bool = False


def _optional_flag(name: str, env: Mapping[str, str] | None) -> bool | None:
    value = lookup(name, env)
    return None if value is None else parse_bool(value, PREFIX + name)


def _fp8_overrides(env: Mapping[str, str]) -> tuple[bool, bool, bool] | None:
    """`FP8_OVERRIDE_LINEAR_PRECISION` as the launcher writes it ("(False, True, False)"), else
    Accelerate's three `FP8_OVERRIDE_FPROP/DGRAD/WGRAD` flags; None when none is set."""
    text = lookup("FP8_OVERRIDE_LINEAR_PRECISION", env)
    name = PREFIX + "FP8_OVERRIDE_LINEAR_PRECISION"
    if text is not None:
        parts = [p for p in text.strip().strip("()[]").replace(" ", "").split(",") if p]
        if len(parts) != 3:
            raise ValueError(
                f"environment variable {name}={text!r} must be three booleans, e.g. (False, False, True)"
            )
        a, b, c = (parse_bool(p, name) for p in parts)
        return (a, b, c)
    flags = [_optional_flag("FP8_OVERRIDE_" + gemm, env) for gemm in ("FPROP", "DGRAD", "WGRAD")]
    if all(f is None for f in flags):
        return None
    return (bool(flags[0]), bool(flags[1]), bool(flags[2]))


def _lower(name: str, env: Mapping[str, str]) -> str | None:
    return (lookup(name, env) or "").strip().lower() or None


_DEEPSPEED_SHARED = ("GRADIENT_CLIPPING", "GRADIENT_ACCUMULATION_STEPS")


def _deepspeed_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The DeepSpeed plugin's variables, each under its `ACCELERANDO_` name whichever prefix set it."""
    names = {k.removeprefix(p) for k in env for p in (PREFIX, ALIAS_PREFIX) if k.startswith(p + "DEEPSPEED_")}
    out = {PREFIX + n: lookup(n, env) for n in (*sorted(names), *_DEEPSPEED_SHARED)}
    return {k: v for k, v in out.items() if v is not None}


def read_settings(env: Mapping[str, str] | None = None) -> EnvSettings:
    """Parse the launcher contract once; bad values fail here with the variable's name."""
    env = os.environ if env is None else env
    return EnvSettings(
        use_cpu=flag("USE_CPU", env=env),
        mixed_precision=lookup("MIXED_PRECISION", env) or None,
        gradient_accumulation_steps=integer("GRADIENT_ACCUMULATION_STEPS", env=env),
        dynamo_backend=lookup("DYNAMO_BACKEND", env) or None,
        dynamo_mode=lookup("DYNAMO_MODE", env) or None,
        dynamo_fullgraph=_optional_flag("DYNAMO_USE_FULLGRAPH", env),
        dynamo_dynamic=_optional_flag("DYNAMO_USE_DYNAMIC", env),
        dynamo_regional=_optional_flag("DYNAMO_USE_REGIONAL_COMPILATION", env),
        use_fsdp=flag("USE_FSDP", env=env),
        use_deepspeed=flag("USE_DEEPSPEED", env=env),
        use_parallelism_config=flag("USE_PARALLELISM_CONFIG", env=env),
        parallelism_variables=with_prefix("PARALLELISM_CONFIG_", env),
        deepspeed_variables=_deepspeed_variables(env),
        fp8_backend=_lower("FP8_BACKEND", env),
        fp8_pad_inner_dim=_optional_flag("FP8_PAD_INNER_DIM", env),
        fp8_enable_fsdp_float8_all_gather=_optional_flag("FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", env),
        fp8_use_autocast_during_eval=_optional_flag("FP8_USE_AUTOCAST_DURING_EVAL", env),
        fp8_margin=integer("FP8_MARGIN", env=env),
        fp8_interval=integer("FP8_INTERVAL", env=env),
        fp8_format=(_lower("FP8_FORMAT", env) or "").upper() or None,
        fp8_amax_history_len=integer("FP8_AMAX_HISTORY_LEN", env=env),
        fp8_amax_compute_algo=_lower("FP8_AMAX_COMPUTE_ALGO", env),
        fp8_override_linear_precision=_fp8_overrides(env),
        fp8_opt_level=(_lower("FP8_OPT_LEVEL", env) or "").upper() or None,
        fp8_recipe_name=_lower("FP8_RECIPE_NAME", env),
        torch_device=lookup("TORCH_DEVICE", env) or None,
        debug_mode=flag("DEBUG_MODE", env=env),
        enable_rich=flag("ENABLE_RICH", env=env),
        log_level=lookup("LOG_LEVEL", env) or None,
        fork_launched=parse_bool(env.get("FORK_LAUNCHED", "0"), "FORK_LAUNCHED"),
    )


def export(values: Mapping[str, str], target: MutableMapping[str, str] | None = None) -> None:
    """Write variables (for child processes started by a launcher)."""
    target = os.environ if target is None else target
    for key, value in values.items():
        target[key] = str(value)


@contextmanager
def patch_environment(**values: object) -> Iterator[None]:
    """Temporarily set variables (upper-cased names), restoring the previous values on exit."""
    saved: dict[str, str | None] = {}
    for key, value in values.items():
        name = key.upper()
        saved[name] = os.environ.get(name)
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextmanager
def clear_environment() -> Iterator[None]:
    """Run a block with an empty environment, restoring it afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def dispatch_cross_memory(env: Mapping[str, str] | None = None) -> bool | None:
    """`ACCELERANDO_DISPATCH_CROSS_MEMORY`: may the ranks on rank 0's host read its memory
    (`process_vm_readv`) instead of going through the ring? Unset (None): where the system already
    allows it, rank 0 changing nothing; `1`: rank 0 also lets any process of its user ptrace it
    (`PR_SET_PTRACER_ANY`, needed under Yama ptrace_scope=1); `0`: never."""
    return _optional_flag("DISPATCH_CROSS_MEMORY", env)


# --- launcher side (owned by the launcher issue): what `accelerando launch` reads and writes ---

# Variable that hides devices from a process, per device kind (`--gpu_ids`).
VISIBLE_DEVICES = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "mlu": "MLU_VISIBLE_DEVICES",
    "musa": "MUSA_VISIBLE_DEVICES",
    "sdaa": "SDAA_VISIBLE_DEVICES",
    "hpu": "HABANA_VISIBLE_MODULES",
    "neuron": "NEURON_RT_VISIBLE_CORES",
}
# torch's agent shares its rendezvous TCPStore with the workers unless this is "1"; sharing makes
# restarted gloo groups read the dead workers' addresses (pytorch/pytorch#135712, cpu-notes.md 12).
DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def config_file_override(env: Mapping[str, str] | None = None) -> str | None:
    """`ACCELERANDO_CONFIG_FILE` (or `ACCELERATE_CONFIG_FILE`): the per-user config file's path."""
    return lookup("CONFIG_FILE", env) or None


def read_option(variable: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(name actually found, value) for a launch option's variable; `ACCELERANDO_X` also as `ACCELERATE_X`."""
    env = os.environ if env is None else env
    names = [variable]
    if variable.startswith(PREFIX):
        names.append(ALIAS_PREFIX + variable[len(PREFIX) :])
    for name in names:
        if name in env:
            return name, env[name]
    return None


def with_prefix(prefix: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable starting with `prefix` (e.g. "FSDP_", "PARALLELISM_CONFIG_"), prefix removed."""
    env = os.environ if env is None else env
    return {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix)}


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times torchrun's agent has restarted this worker group (0 on the first attempt)."""
    value = raw("TORCHELASTIC_RESTART_COUNT", env)
    return int(value) if value and value.isdigit() else 0


AGENT_PID = "ACCELERANDO_AGENT_PID"


def launch_environment(
    exports: Mapping[str, str], base: Mapping[str, str] | None = None, *, shared_store: bool = False
) -> dict[str, str]:
    """What to add to the environment before starting the elastic agent (not applied here).

    `exports` are the launcher's settings for the training processes. Unless the caller already
    chose, the agent's rendezvous store is not shared with the workers, the configuration that
    made restarts reliable on CPU (cpu-notes.md section 12). `ACCELERANDO_AGENT_PID` names this
    process, the agent, so that a worker can tell whether its parent already died.
    """
    base = os.environ if base is None else base
    out = {k: str(v) for k, v in exports.items()}
    out[AGENT_PID] = str(os.getpid())  # the worker bootstrap ends itself when this process dies
    if not shared_store and DISABLE_SHARED_STORE not in base:
        out[DISABLE_SHARED_STORE] = "1"
    return out


def unset(names: list[str], target: MutableMapping[str, str] | None = None) -> None:
    """Remove variables (e.g. a stale `TORCHELASTIC_ERROR_FILE` before starting an agent)."""
    target = os.environ if target is None else target
    for name in names:
        target.pop(name, None)
