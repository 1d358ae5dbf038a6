"""Resolve an Accelerator's arguments, plugin objects and the launcher's environment, once.

Precedence: explicit arguments > plugin objects > environment (set by `accelerando launch`) >
defaults. The result is frozen; components receive it in their constructors.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from accelerando.config import env
from accelerando.config.fp8 import Fp8Recipe, Fp8Request, resolve_fp8
from accelerando.config.options import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    ProjectConfiguration,
    TERecipeKwargs,
    TorchDynamoPlugin,
)
from accelerando.precision.registry import validate_mixed_precision

_HANDLER_SLOTS: dict[type, str] = {
    AutocastKwargs: "autocast",
    DistributedDataParallelKwargs: "ddp",
    GradScalerKwargs: "scaler",
    InitProcessGroupKwargs: "init",
    ProfileKwargs: "profile",
    AORecipeKwargs: "fp8",
    TERecipeKwargs: "fp8",
    MSAMPRecipeKwargs: "fp8",
}

# Data-loader switches that Accelerate 1.0 moved into DataLoaderConfiguration. Old scripts still
# pass them to Accelerator(): they are applied with a FutureWarning rather than breaking the script.
DATALOADER_ARGUMENTS = ("dispatch_batches", "split_batches", "even_batches", "use_seedable_sampler")

# Arguments that Accelerate 1.0 removed outright; each gets an error that teaches the new spelling.
MOVED_ARGUMENTS = {
    "use_fp16": "mixed_precision='fp16'",
    "logging_dir": "project_config=ProjectConfiguration(logging_dir=...) or project_dir=...",
}


@dataclass(frozen=True)
class Handlers:
    autocast: AutocastKwargs = field(default_factory=AutocastKwargs)
    ddp: DistributedDataParallelKwargs | None = None
    scaler: GradScalerKwargs | None = None
    init: InitProcessGroupKwargs | None = None
    profile: ProfileKwargs | None = None
    fp8: Fp8Recipe | None = None


@dataclass(frozen=True)
class ResolvedConfig:
    cpu: bool
    mixed_precision: str
    gradient: GradientAccumulationPlugin
    dataloader: DataLoaderConfiguration
    project: ProjectConfiguration
    handlers: Handlers
    dynamo: TorchDynamoPlugin
    device_placement: bool
    step_scheduler_with_optimizer: bool
    rng_types: tuple[str, ...]
    fsdp_plugin: Any = None
    use_fsdp: bool = False
    use_deepspeed: bool = False
    deepspeed_plugins: dict[str, Any] | None = None  # by name, the first one selected first
    parallelism: Any = None  # ParallelismConfig, or None: the strategy's own layout
    fp8: Fp8Request | None = None  # mixed_precision="fp8": backend asked for and completed recipes


# Accelerate's arguments for engines accelerando does not run yet. None, their default (what
# transformers' Trainer passes to every Accelerator it builds), is accepted as Accelerate accepts it;
# any other value is refused, naming what to use instead.
NOT_YET_ARGUMENTS = {
    "megatron_lm_plugin": "Megatron-LM (not planned; see README 'Not there yet')",
}


def fold_old_arguments(
    extra: dict[str, Any], dataloader_config: DataLoaderConfiguration | None, parallelism_config: Any = None
) -> tuple[DataLoaderConfiguration | None, Any]:
    """Apply the deprecated keywords: data-loader ones onto a DataLoaderConfiguration, `torch_tp_plugin`
    onto a ParallelismConfig; refuse anything else.

    A keyword that contradicts an explicitly passed configuration is an error naming both values;
    the not-yet engines' arguments are accepted only as None, their default.
    """
    from accelerando.parallelism_config import parallelism_from_tp_plugin

    parallelism_config = parallelism_from_tp_plugin(extra.pop("torch_tp_plugin", None), parallelism_config)
    for name in [n for n in extra if n in NOT_YET_ARGUMENTS]:
        value = extra.pop(name)
        if value is not None:
            raise NotImplementedError(
                f"Accelerator({name}={type(value).__name__}(...)): {NOT_YET_ARGUMENTS[name]} is not "
                f"available yet in accelerando; pass {name}=None (the default) and train with DDP or FSDP"
            )
    return _fold_dataloader_arguments(extra, dataloader_config), parallelism_config


def _fold_dataloader_arguments(
    extra: dict[str, Any], dataloader_config: DataLoaderConfiguration | None
) -> DataLoaderConfiguration | None:
    moved = {name: extra.pop(name) for name in DATALOADER_ARGUMENTS if name in extra}
    for name in extra:
        if name in MOVED_ARGUMENTS:
            raise TypeError(
                f"Accelerator() no longer accepts {name!r} (moved in Accelerate 1.0); use {MOVED_ARGUMENTS[name]}"
            )
    if extra:
        raise TypeError(f"Accelerator() got unexpected keyword arguments: {', '.join(sorted(extra))}")
    if not moved:
        return dataloader_config
    for name, value in moved.items():
        warnings.warn(
            f"Passing {name}={value!r} to Accelerator() is deprecated (Accelerate 1.0); "
            f"pass dataloader_config=DataLoaderConfiguration({name}={value!r}) instead",
            FutureWarning,
            stacklevel=4,
        )
        if dataloader_config is not None and getattr(dataloader_config, name) != value:
            raise ValueError(
                f"Accelerator({name}={value!r}) contradicts dataloader_config.{name}="
                f"{getattr(dataloader_config, name)!r}; pass it in one place only"
            )
    if dataloader_config is not None:
        return dataloader_config
    return DataLoaderConfiguration(**moved)


def sort_handlers(kwargs_handlers: list[Any] | None) -> Handlers:
    found: dict[str, Any] = {}
    for handler in kwargs_handlers or []:
        if hasattr(handler, "to_recipe"):  # FP8RecipeKwargs (Accelerate 1.0): its backend's recipe
            handler = handler.to_recipe()
        if not isinstance(handler, KwargsHandler):
            raise TypeError(
                f"kwargs_handlers accepts KwargsHandler instances ({', '.join(c.__name__ for c in _HANDLER_SLOTS)}),"
                f" got {type(handler).__name__}"
            )
        slot = _HANDLER_SLOTS.get(type(handler))
        if slot is None:
            raise TypeError(
                f"unsupported kwargs handler {type(handler).__name__}; accepted: "
                f"{', '.join(c.__name__ for c in _HANDLER_SLOTS)}"
            )
        if slot in found:
            raise ValueError(f"you can only pass one {type(handler).__name__} in kwargs_handlers")
        found[slot] = handler
    return Handlers(**found)


def _gradient_plugin(steps: int, plugin: GradientAccumulationPlugin | None, settings: env.EnvSettings) -> Any:
    if plugin is not None:
        if steps != 1:
            raise ValueError(
                "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both "
                f"(got gradient_accumulation_steps={steps} and {plugin})"
            )
        resolved = dataclasses.replace(plugin)
    else:
        from_env = settings.gradient_accumulation_steps
        resolved = GradientAccumulationPlugin(num_steps=steps if steps != 1 or from_env is None else from_env)
    n = resolved.num_steps if resolved.num_steps is not None else 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {resolved.num_steps!r}")
    resolved.num_steps = n
    return resolved


def _deepspeed(
    given: tuple[Any, Any],
    fsdp_plugin: Any,
    settings: env.EnvSettings,
    precision: tuple[str, str | None],
    gradient: GradientAccumulationPlugin,
    accumulation_from: str | None,
) -> tuple[dict[str, Any] | None, str, GradientAccumulationPlugin]:
    """The DeepSpeed plugins by name (None without DeepSpeed), with the precision and accumulation
    the Accelerator and every plugin agree on (filled into their "auto" values)."""
    from accelerando.config import deepspeed

    plugins = deepspeed.plugins_from(
        *given, use_deepspeed=settings.use_deepspeed, variables=settings.deepspeed_variables
    )
    if plugins is None:
        return None, precision[0], gradient
    if fsdp_plugin is not None or settings.use_fsdp:
        raise ValueError("DeepSpeed and FSDP were both asked for; choose one of them")
    mixed, steps = deepspeed.reconcile(
        plugins,
        mixed_precision=precision[0],
        precision_from=precision[1],
        gradient_accumulation_steps=int(gradient.num_steps or 1),
        accumulation_from=accumulation_from,
    )
    return plugins, mixed, dataclasses.replace(gradient, num_steps=steps)


def _precision_source(argument: Any, settings: env.EnvSettings) -> str | None:
    """Where an explicit precision came from; the launcher's "no" only restates the default."""
    if argument is not None:
        return "Accelerator argument"
    if settings.mixed_precision not in (None, "no"):
        return "launcher (ACCELERANDO_MIXED_PRECISION)"
    return None


def _accumulation_source(
    steps: int, plugin: GradientAccumulationPlugin | None, settings: env.EnvSettings
) -> str | None:
    if plugin is not None or steps != 1:
        return "Accelerator argument"
    if settings.gradient_accumulation_steps is not None:
        return "launcher (ACCELERANDO_GRADIENT_ACCUMULATION_STEPS)"
    return None


def _parallelism(given: Any, settings: env.EnvSettings) -> Any:
    """The ParallelismConfig passed, or one read from the launcher's `PARALLELISM_CONFIG_*` variables."""
    from accelerando.parallelism_config import ParallelismConfig

    if given is None:
        if not settings.use_parallelism_config:
            return None
        sizes: dict[str, Any] = {}
        for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            value = settings.parallelism_variables.get(f"{name.upper()}_SIZE")
            try:
                sizes[f"{name}_size"] = int(value) if value else 1
            except ValueError:
                raise ValueError(
                    f"environment variable PARALLELISM_CONFIG_{name.upper()}_SIZE={value!r} is not an integer"
                ) from None
        return ParallelismConfig(**sizes)
    if not isinstance(given, ParallelismConfig):
        raise TypeError(f"parallelism_config must be a ParallelismConfig, got {type(given).__name__}")
    return given


def _dynamo(backend: Any, plugin: TorchDynamoPlugin | None, settings: env.EnvSettings) -> TorchDynamoPlugin:
    if backend is not None and plugin is not None:
        raise ValueError("pass either dynamo_backend or dynamo_plugin, not both")
    if plugin is not None:
        return plugin
    return TorchDynamoPlugin(
        backend=backend or settings.dynamo_backend or DynamoBackend.NO,
        mode=settings.dynamo_mode or "default",
        fullgraph=bool(settings.dynamo_fullgraph),
        dynamic=settings.dynamo_dynamic,
        use_regional_compilation=bool(settings.dynamo_regional),
    )


def resolve(
    *,
    cpu: bool,
    mixed_precision: Any,
    gradient_accumulation_steps: int,
    gradient_accumulation_plugin: GradientAccumulationPlugin | None,
    dataloader_config: DataLoaderConfiguration | None,
    project_dir: str | None,
    project_config: ProjectConfiguration | None,
    kwargs_handlers: list[Any] | None,
    dynamo_backend: Any,
    dynamo_plugin: TorchDynamoPlugin | None,
    device_placement: bool,
    step_scheduler_with_optimizer: bool,
    rng_types: list[Any] | None,
    fsdp_plugin: Any,
    settings: env.EnvSettings,
    deepspeed_plugins: tuple[Any, Any] = (None, None),
    parallelism_config: Any = None,
) -> ResolvedConfig:
    """Validate everything before any work starts; errors name the value and what is accepted.

    `deepspeed_plugins` is the pair (deepspeed_plugin, deepspeed_plugins) as the Accelerator got them.
    """
    handlers = sort_handlers(kwargs_handlers)
    precision = validate_mixed_precision(
        mixed_precision if mixed_precision is not None else settings.mixed_precision
    )
    gradient = _gradient_plugin(gradient_accumulation_steps, gradient_accumulation_plugin, settings)
    ds_plugins, precision, gradient = _deepspeed(
        deepspeed_plugins,
        fsdp_plugin,
        settings,
        (precision, _precision_source(mixed_precision, settings)),
        gradient,
        _accumulation_source(gradient_accumulation_steps, gradient_accumulation_plugin, settings),
    )
    if handlers.fp8 is not None and precision != "fp8":
        raise ValueError(
            f"an fp8 recipe ({type(handlers.fp8).__name__}) was given but mixed_precision is {precision!r}; "
            "use 'fp8'"
        )
    fp8 = resolve_fp8(handlers.fp8, settings) if precision == "fp8" else None
    if fp8 is not None and fp8.requested is not None:
        handlers = dataclasses.replace(handlers, fp8=fp8.recipes[fp8.requested])
    if dataloader_config is not None and not isinstance(dataloader_config, DataLoaderConfiguration):
        raise TypeError(
            f"dataloader_config must be a DataLoaderConfiguration, got {type(dataloader_config).__name__}"
        )
    project = dataclasses.replace(project_config) if project_config is not None else ProjectConfiguration()
    if project_dir is not None:
        project.set_directories(str(project_dir))
    return ResolvedConfig(
        cpu=cpu or settings.use_cpu,
        mixed_precision=precision,
        gradient=gradient,
        dataloader=dataloader_config or DataLoaderConfiguration(),
        project=project,
        handlers=handlers,
        dynamo=_dynamo(dynamo_backend, dynamo_plugin, settings),
        device_placement=device_placement,
        step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        rng_types=tuple(str(r) for r in (rng_types or ["generator"])),
        fsdp_plugin=fsdp_plugin,
        use_fsdp=fsdp_plugin is not None or settings.use_fsdp,
        use_deepspeed=ds_plugins is not None,
        deepspeed_plugins=ds_plugins,
        parallelism=_parallelism(parallelism_config, settings),
        fp8=fp8,
    )
