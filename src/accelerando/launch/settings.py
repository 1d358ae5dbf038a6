"""Launch configuration, resolved once: CLI flag > environment > config file > defaults.

Pure functions of their inputs (the parsed flags, an environment mapping, a loaded config file and
what was detected about the machine), so every precedence rule is tested without processes.
Each resolved value keeps the name of its source, which `launch` prints before starting.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from accelerando.config import env as envmod
from accelerando.config.yaml_config import ConfigFile
from accelerando.launch.flags import BY_NAME, DEEPSPEED, FP8, FSDP, OPTIONS, PARALLEL, Option

DEFAULT = "default"
# Shown in the printout even when they kept their default.
ALWAYS_SHOWN = (
    "cpu", "mixed_precision", "num_processes", "nproc_per_node", "num_machines", "machine_rank",
    "main_process_ip", "main_process_port", "rdzv_backend", "max_restarts",
)  # fmt: skip
MULTI_NODE_PORT = 29500
# Compile backends every torch build registers; others are looked up (importing torch._dynamo, ~2 s).
BUILTIN_COMPILE_BACKENDS = frozenset({"no", "eager", "aot_eager", "inductor", "cudagraphs"})
RDZV_SECONDS = ("join_timeout", "read_timeout", "timeout", "last_call_timeout", "close_timeout")


@dataclass(frozen=True)
class Detected:
    """What launch found about this machine (kept apart so resolution stays pure)."""

    device_type: str = "cpu"
    device_count: int = 0
    cpu_cores: int = 1
    fp8_packages: frozenset[str] = frozenset({"ao"})  # fp8 backends whose package is installed
    compute_capability: tuple[int, int] | None = None  # CUDA only


def detect_machine() -> Detected:
    """Read this machine's accelerator, its count and the physical cores (the one impure input)."""
    import importlib.util

    import psutil

    from accelerando.devices.registry import accelerator_device

    device = accelerator_device()
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    count = device.device_count() if device.type != "cpu" else 0
    from accelerando.precision.fp8_probe import PACKAGES

    # find_spec only (importing torchao takes seconds); each process imports what it uses
    fp8 = frozenset(b for b, module in PACKAGES.items() if importlib.util.find_spec(module.split(".")[0]))
    return Detected(
        device_type=device.type,
        device_count=count,
        cpu_cores=int(cores),
        fp8_packages=fp8,
        compute_capability=device.compute_capability() if count else None,
    )


@dataclass(frozen=True)
class Resolved:
    """Option name -> value, and option name -> where the value came from."""

    values: Mapping[str, Any]
    sources: Mapping[str, str]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def with_value(self, name: str, value: Any, source: str) -> Resolved:
        return replace(self, values={**self.values, name: value}, sources={**self.sources, name: source})


def coerce(opt: Option, value: Any, where: str) -> Any:
    """Convert a value from a file or the environment to the option's type; errors name the source."""
    try:
        if opt.kind in ("switch", "bool"):
            out: Any = value if isinstance(value, bool) else envmod.parse_bool(str(value), where)
        elif opt.kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            out = int(value)
        elif opt.kind == "float":
            out = float(value)
        else:
            if value is False and opt.choices and "no" in opt.choices:  # YAML 1.1 reads `no` as False
                value = "no"
            out = str(value).lower() if opt.lower else str(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a valid {opt.kind} for {opt.name}") from None
    if opt.choices and out not in opt.choices:
        raise ValueError(f"{where}: {opt.name}={value!r} is not one of {', '.join(opt.choices)}")
    _check_range(opt, out, where)
    if out in opt.refused_values:
        raise ValueError(f"{_label(opt.name, where)}={out}: {opt.refused_values[out]}")
    return out


def _check_range(opt: Option, value: Any, where: str) -> None:
    low, high = opt.minimum, opt.maximum
    if (low is None or value >= low) and (high is None or value <= high):
        return
    if low is not None and high is not None:
        accepted = f"between {low:g} and {high:g}"
    else:
        accepted = f"at least {low:g}" if low is not None else f"at most {high:g}"
    raise ValueError(f"{where}: {opt.name}={value!r} must be {accepted}")


def _label(name: str, where: str) -> str:
    """`--name` when the flag gave it, else `name (from <source>)`."""
    return where if where == f"--{name}" else f"{name} (from {where})"


def _refuse(opt: Option, value: Any, where: str) -> None:
    """Stop on a setting accelerando cannot honour yet (a switch only when it is on)."""
    if opt.refused and (opt.kind != "switch" or value):
        raise ValueError(f"{_label(opt.name, where)}: {opt.refused}")


def read_sources(cli: Mapping[str, Any], environ: Mapping[str, str], config: ConfigFile | None) -> Resolved:
    """Pick every option's value by precedence: flag > environment > config file > default."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in OPTIONS:
        found = envmod.read_option(opt.env, environ) if opt.env else None
        if opt.name in cli and cli[opt.name] is not None:
            raw, where = cli[opt.name], f"--{opt.name}"
        elif found is not None and found[1] != "":
            raw, where = found[1], f"env {found[0]}"
        elif config is not None and opt.name in config.values:
            raw, where = config.values[opt.name], f"config {config.path} ({config.keys[opt.name]})"
        else:
            values[opt.name], sources[opt.name] = opt.default, DEFAULT
            continue
        if opt.kind != "switch":
            _refuse(opt, raw, where)  # before parsing: a refused setting is refused whatever its value
        values[opt.name], sources[opt.name] = coerce(opt, raw, where), where
        _refuse(opt, values[opt.name], where)
    return Resolved(values, sources)


def given(r: Resolved, name: str) -> bool:
    """The setting came from a flag, the environment or the config file (not a default)."""
    return r.sources[name] != DEFAULT and r[name] is not None


def _check_supported(r: Resolved) -> None:
    if (
        r["cpu"]
        and r["multi_gpu"]
        and r.sources["cpu"].startswith("--")
        and r.sources["multi_gpu"].startswith("--")
    ):
        raise ValueError("--cpu and --multi_gpu exclude each other; pass one of them")


def _resolve_device(r: Resolved, detected: Detected) -> Resolved:
    """CPU when asked, or when the machine has no accelerator (gloo, no extra variable needed)."""
    if r["cpu"]:
        return r
    if detected.device_type == "cpu":
        if r["multi_gpu"] or r.sources["cpu"] != DEFAULT:
            warnings.warn(
                "no accelerator found on this machine: running the processes on CPU (gloo)", stacklevel=3
            )
        return r.with_value("cpu", True, "detected: no accelerator")
    return r


def _resolve_counts(r: Resolved, detected: Detected) -> Resolved:
    """Total and per-machine process counts; Accelerate's num_processes is the total."""
    machines, rank = r["num_machines"], r["machine_rank"]
    if rank >= machines:
        raise ValueError(
            f"machine_rank={rank} (from {r.sources['machine_rank']}) must be in [0, {machines - 1}]"
        )
    per_node, total = r["nproc_per_node"], r["num_processes"]
    if per_node is None and total is None:
        local = 1 if r["cpu"] else max(detected.device_count, 1)
        what = "1 CPU process" if r["cpu"] else f"{local} {detected.device_type} device(s)"
        r = r.with_value("num_processes", local * machines, f"default: {what} per machine")
        total = local * machines
    if per_node is None:
        if total % machines:
            raise ValueError(
                f"num_processes={total} (from {r.sources['num_processes']}) is the total over {machines} machine(s) "
                "and must be a positive multiple of it; for machines with different counts pass --nproc_per_node"
            )
        r = r.with_value("nproc_per_node", total // machines, "derived: num_processes / num_machines")
    elif total is None:
        r = r.with_value("num_processes", per_node * machines, "derived: nproc_per_node x num_machines")
    return r


def _resolve_network(
    r: Resolved, port_is_free: Callable[[int], bool], free_port: Callable[[], int]
) -> Resolved:
    """Rendezvous address and backend: a private c10d one on one machine, machine 0's otherwise."""
    if r["num_machines"] == 1:
        if r["main_process_ip"] is None:
            r = r.with_value("main_process_ip", "127.0.0.1", "default: one machine")
        port = r["main_process_port"]
        if port is None:
            r = r.with_value("main_process_port", free_port(), "default: a free port")
        elif not port_is_free(port):
            warnings.warn(f"main_process_port {port} is in use; using a free port instead", stacklevel=3)
            r = r.with_value("main_process_port", free_port(), f"free port ({port} was in use)")
        if r["rdzv_backend"] != "c10d":
            r = r.with_value("rdzv_backend", "c10d", "one machine: private c10d rendezvous")
        return r
    if not r["main_process_ip"]:
        raise ValueError(
            f"--num_machines {r['num_machines']} needs --main_process_ip (the address of machine 0)"
        )
    if r["main_process_port"] is None:
        r = r.with_value("main_process_port", MULTI_NODE_PORT, DEFAULT)
    if r["rdzv_backend"] == "static" and r["max_restarts"] > 0:
        warnings.warn(
            "--max_restarts with static rendezvous is unreliable (restarted gloo/NCCL groups can read stale "
            "addresses); prefer --rdzv_backend c10d",
            stacklevel=3,
        )
    return r


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """'k1=v1,k2=v2' -> dict; errors name the bad entry."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"--rdzv_conf entry {item!r} is not key=value (example: join_timeout=600,read_timeout=60)"
            )
        out[key.strip()] = value.strip()
    return out


def _validate_misc(r: Resolved, detected: Detected) -> Resolved:
    if r["monitor_interval"] <= 0:
        raise ValueError(f"monitor_interval={r['monitor_interval']} must be positive (seconds)")
    for key, text in parse_rdzv_conf(r["rdzv_conf"]).items():
        if key in RDZV_SECONDS and not _is_number(text):
            raise ValueError(f"--rdzv_conf {key}={text!r} must be a number of seconds")
    parse_tee(r["tee"])
    ip = r["main_process_ip"]
    if ip is not None and (not str(ip).strip() or any(c.isspace() for c in str(ip))):
        raise ValueError(
            f"main_process_ip={ip!r} (from {r.sources['main_process_ip']}) is not a host name or address"
        )
    ids = r["gpu_ids"]
    if ids is not None and ids != "all" and not all(p.strip().isdigit() for p in str(ids).split(",")):
        raise ValueError(f"gpu_ids={ids!r} must be 'all' or comma-separated device indices such as '0,1'")
    if r["num_cpu_threads_per_process"] is None:
        local = r["nproc_per_node"]
        value = max(1, detected.cpu_cores // local) if r["cpu"] else 1
        r = r.with_value("num_cpu_threads_per_process", value, "derived: cores / local processes")
    return r


def resolve(
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    config: ConfigFile | None,
    detected: Detected,
    *,
    port_is_free: Callable[[int], bool] = lambda port: True,
    free_port: Callable[[], int] = lambda: 29500,
    compile_backends: Callable[[], Collection[str]] | None = None,
) -> Resolved:
    """The whole launch configuration for this machine, or a ValueError naming the bad value.

    `compile_backends` lists torch's registered compile backends; it is asked only for a backend
    outside the built-in ones (None: not checked).
    """
    unknown = set(cli) - set(BY_NAME)
    if unknown:
        raise TypeError(f"unknown launch options: {', '.join(sorted(unknown))}")
    r = read_sources(cli, environ, config)
    _check_supported(r)
    _check_precision(r, detected)
    _check_compile_backend(r, compile_backends)
    _check_fsdp(r)
    _check_deepspeed(r)
    r = _resolve_device(r, detected)
    r = _resolve_counts(r, detected)
    r = _resolve_parallelism(r)
    r = _resolve_network(r, port_is_free, free_port)
    return _validate_misc(r, detected)


_MESH_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")


def _resolve_parallelism(r: Resolved) -> Resolved:
    """Any ParallelismConfig setting implies --use_parallelism_config (Accelerate: a non-empty block in
    the config file does); sizes that do not multiply to the process count stop the launch."""
    named = [o.name for o in OPTIONS if o.group == PARALLEL and given(r, o.name)]
    if named and not r["use_parallelism_config"]:
        r = r.with_value("use_parallelism_config", True, f"derived: {_label(named[0], r.sources[named[0]])}")
    if not r["use_parallelism_config"]:
        return r
    sizes = {name: r["parallelism_config_" + name] or 1 for name in _MESH_SIZES}
    total = 1
    for size in sizes.values():
        total *= size
    if total == 1:
        return r  # every size 1: the strategy's own layout
    product = " x ".join(
        f"{_label('parallelism_config_' + name, r.sources['parallelism_config_' + name])}={size}"
        if given(r, "parallelism_config_" + name)
        else f"{name}={size}"
        for name, size in sizes.items()
    )
    if total != r["num_processes"]:
        raise ValueError(
            f"ParallelismConfig {product} = {total}, but the launch starts {r['num_processes']} processes "
            f"(num_processes, from {r.sources['num_processes']}); the sizes must multiply to it"
        )
    # The strategy the processes will run decides whether it can use these sizes (the same check).
    from accelerando.parallel.mesh import MeshShape
    from accelerando.strategies.registry import strategy_class

    name = "fsdp2" if r["use_fsdp"] else "deepspeed" if r["use_deepspeed"] else "ddp"
    shape = MeshShape(*(sizes[n] for n in ("dp_replicate_size", "dp_shard_size", "cp_size", "tp_size")))
    try:
        strategy_class(name).adopt_mesh_shape(shape)
    except ValueError as err:
        raise ValueError(f"{product}: {err}") from None
    return r


def _check_precision(r: Resolved, detected: Detected) -> None:
    """fp8 needs torchao; fp8 settings need fp8 (they would be read by nobody otherwise)."""
    from accelerando.precision.fp8_probe import Fp8BackendUnavailable, Fp8Facts, choose_backend

    precision, where = r["mixed_precision"], r.sources["mixed_precision"]
    if precision == "fp8":  # the capability probe, on what launch detected (processes probe again)
        facts = Fp8Facts(detected.device_type, detected.compute_capability, detected.fp8_packages)
        backend, backend_where = r["fp8_backend"], r.sources["fp8_backend"]
        try:
            choose_backend(backend, facts)
        except Fp8BackendUnavailable as err:
            name, source = ("fp8_backend", backend_where) if backend else ("mixed_precision", where)
            raise ValueError(f"{_label(name, source)}={backend or 'fp8'}: {err}") from None
    fp8_given = [o.name for o in OPTIONS if o.group == FP8 and given(r, o.name)]
    if fp8_given and precision != "fp8" and where != DEFAULT:
        name = fp8_given[0]
        raise ValueError(
            f"{_label(name, r.sources[name])} has no effect with {_label('mixed_precision', where)}="
            f"{precision}: fp8 settings need mixed_precision fp8"
        )


def _check_compile_backend(r: Resolved, compile_backends: Callable[[], Collection[str]] | None) -> None:
    backend = r["dynamo_backend"]
    if backend in BUILTIN_COMPILE_BACKENDS or compile_backends is None:
        return
    available = compile_backends()
    if backend not in available:
        raise ValueError(
            f"{_label('dynamo_backend', r.sources['dynamo_backend'])}={backend}: this torch has no compile "
            f"backend of that name (a package may provide it); registered: {', '.join(sorted(available))}"
        )


def _check_fsdp(r: Resolved) -> None:
    """Each `FSDP_*` value parsed as the plugin will parse it in every process, then all together."""
    from accelerando.config import fsdp

    exported: dict[str, str] = {}
    for opt in OPTIONS:
        if opt.group == FSDP and opt.env and given(r, opt.name):
            text = _text(r[opt.name])
            try:
                fsdp.check_settings({opt.env: text})
            except ValueError as err:
                raise ValueError(f"{_label(opt.name, r.sources[opt.name])}: {err}") from None
            exported[opt.env] = text
    if exported:
        try:
            fsdp.check_settings(exported)
        except ValueError as err:
            raise ValueError(f"FSDP settings: {err}") from None


# DeepSpeed-group settings that every strategy reads, or that are only accepted (no effect).
_DEEPSPEED_SHARED = ("gradient_accumulation_steps", "deepspeed_multinode_launcher")


def _check_deepspeed(r: Resolved) -> None:
    """DeepSpeed settings need --use_deepspeed; then they are checked as each process's plugin will
    check them (config file readable, fields agreeing with it, precision and accumulation agreeing)."""
    given_ds = [
        o.name
        for o in OPTIONS
        if o.group == DEEPSPEED and given(r, o.name) and o.name not in _DEEPSPEED_SHARED
    ]
    if not r["use_deepspeed"]:
        if given_ds:
            name = given_ds[0]
            hint = (
                "; without DeepSpeed call accelerator.clip_grad_norm_ in the loop"
                if name == "gradient_clipping"
                else ""
            )
            raise ValueError(f"{_label(name, r.sources[name])} has no effect without --use_deepspeed{hint}")
        return
    if r["use_fsdp"]:
        raise ValueError("--use_deepspeed and --use_fsdp exclude each other; choose one")
    from accelerando.config import deepspeed

    if given(r, "deepspeed_config_file"):
        try:
            deepspeed.HfDeepSpeedConfig(r["deepspeed_config_file"])
        except ValueError as err:
            raise ValueError(
                f"{_label('deepspeed_config_file', r.sources['deepspeed_config_file'])}: {err}"
            ) from None
    exported = {
        o.env: _text(r[o.name]) for o in OPTIONS if o.group == DEEPSPEED and o.env and given(r, o.name)
    }
    precision, where = r["mixed_precision"], r.sources["mixed_precision"]
    steps_where = r.sources["gradient_accumulation_steps"]
    try:
        deepspeed.check_settings(
            exported,
            mixed_precision=precision,
            precision_from=_label("mixed_precision", where)
            if where != DEFAULT and precision != "no"
            else None,
            accumulation_from=_label("gradient_accumulation_steps", steps_where)
            if given(r, "gradient_accumulation_steps")
            else None,
        )
    except (ValueError, TypeError) as err:
        raise ValueError(f"DeepSpeed settings: {err}") from None


def parse_tee(text: str) -> Any:
    """torch's `Std` for `--tee` (0-3, or per local rank such as '0:3,1:1'); ValueError naming it."""
    from torch.distributed.elastic.multiprocessing import Std

    try:
        return Std.from_str(str(text))
    except ValueError:
        raise ValueError(f"--tee {text!r} must be 0, 1, 2 or 3 (or per rank, e.g. '0:3,1:1')") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def child_exports(r: Resolved, device_type: str) -> dict[str, str]:
    """Variables for the training processes: every exported option that was set, plus device masks."""
    out: dict[str, str] = {}
    for opt in OPTIONS:
        if opt.export and opt.env and r.sources[opt.name] != DEFAULT and r[opt.name] is not None:
            out[opt.env] = _text(r[opt.name])
    ids = r["gpu_ids"]
    if ids and ids != "all" and not r["cpu"] and device_type in envmod.VISIBLE_DEVICES:
        out[envmod.VISIBLE_DEVICES[device_type]] = str(ids).replace(" ", "")
    return out


def report(r: Resolved) -> str:
    """The resolved configuration, one value per line with its source."""
    shown = [o.name for o in OPTIONS if o.name in ALWAYS_SHOWN or r.sources[o.name] != DEFAULT]
    width = max(len(n) for n in shown)
    lines = ["accelerando launch: resolved configuration (flag > environment > config file > default)"]
    for name in shown:
        value = "-" if r[name] is None else _text(r[name])
        lines.append(f"  {name:<{width}}  {value:<12} [{r.sources[name]}]")
    return "\n".join(lines)
