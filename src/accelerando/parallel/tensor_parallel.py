"""Tensor parallelism: a plan of `ParallelStyle`s applied with torch's `parallelize_module` on the `tp` mesh.

The plan is the user's (`TorchTensorParallelConfig(tp_plan=...)`) or, for a transformers model, the
model's own (`model.tp_plan`: its `base_model_tp_plan` under the base model's prefix plus the heads').
transformers names its styles with strings; the ones with a plain torch equivalent are translated
here, any other is refused by name. A model that is already tensor parallel (loaded by transformers
with `tp_plan="auto"`) is used as it is once its mesh size is checked. Every plan key must name at
least one module: torch would skip a key that matches nothing with only a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fnmatch import fnmatch
from typing import Any

import torch


def _styles() -> dict[str, Callable[[], Any]]:
    """transformers' style names -> the torch `ParallelStyle` that computes the same thing."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": SequenceParallel,
    }


def model_plan(model: torch.nn.Module) -> dict[str, Any] | None:
    """A transformers model's own plan, keyed from `model` itself (None for other modules)."""
    for name in ("tp_plan", "_tp_plan"):
        plan = getattr(model, name, None)
        if isinstance(plan, Mapping) and plan:
            return dict(plan)
    return None


def to_styles(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Translate style names to torch `ParallelStyle`s; `ParallelStyle` objects pass through."""
    from torch.distributed.tensor.parallel import ParallelStyle

    styles = _styles()
    out: dict[str, Any] = {}
    for key, style in plan.items():
        if isinstance(style, ParallelStyle):
            out[key] = style
        elif isinstance(style, str) and style in styles:
            out[key] = styles[style]()
        else:
            raise ValueError(
                f"tensor-parallel plan entry {key!r}: {style!r} is not a ParallelStyle nor one of the "
                f"style names accelerando translates ({', '.join(sorted(styles))})"
            )
    return out


def unmatched_keys(model: torch.nn.Module, plan: Mapping[str, Any]) -> list[str]:
    """Plan keys (dotted module paths, `*` wildcards per component) that match no module of `model`."""
    names = [name.split(".") for name, _ in model.named_modules() if name]
    missing = []
    for key in plan:
        parts = key.split(".")
        if key and not any(
            len(n) == len(parts) and all(fnmatch(a, p) for a, p in zip(n, parts)) for n in names
        ):
            missing.append(key)
    return missing


def _parallel_size(model: torch.nn.Module) -> int | None:
    """The mesh size of a model whose parameters are already DTensors, or None."""
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if isinstance(param, DTensor):
            return int(param.device_mesh.size())
    return None


def apply_tensor_parallel(
    model: torch.nn.Module, tp_mesh: Any, user_plan: Mapping[str, Any] | None = None
) -> torch.nn.Module:
    """Shard `model` over `tp_mesh` in place (its parameters become DTensors) and return it."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp_size = int(tp_mesh.size())
    already = _parallel_size(model)
    if already is not None:
        if already != tp_size:
            raise ValueError(
                f"{type(model).__name__} is already tensor parallel over {already} ranks, but the "
                f"ParallelismConfig has tp_size={tp_size}; load it with the same size"
            )
        return model
    plan = dict(user_plan) if user_plan else model_plan(model)
    if not plan:
        raise ValueError(
            f"tp_size={tp_size} but {type(model).__name__} has no tensor-parallel plan: pass one with "
            "ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan={'module.path': ColwiseParallel(), "
            "...})) or use a transformers model that defines `base_model_tp_plan`"
        )
    missing = unmatched_keys(model, plan)
    if missing:
        raise ValueError(
            f"tensor-parallel plan keys {missing} match no module of {type(model).__name__}; "
            "keys are dotted module paths (as in named_modules()), '*' matching one component"
        )
    return parallelize_module(model, tp_mesh, to_styles(plan))
