"""torch.compile of prepared models: in place (`Module.compile`), whole model or repeated blocks.

Compiling in place keeps the module's type and its state-dict keys (no `_orig_mod.` prefix),
so checkpoints look the same compiled or not. `compile_regions` is Accelerate's utility of that
name for any model, dispatched big models included: a module with a device hook (`_hf_hook`, see
`big_model/hooks.py`) has its original forward compiled, so the hook (device moves, weights read
from disk) stays eager outside the graph and causes no graph break.
"""

from __future__ import annotations

from typing import Any

import torch

from accelerando.config.options import DynamoBackend, TorchDynamoPlugin


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Children of ModuleLists whose entries share a class: the layers of a transformer."""
    blocks: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            if len({type(m) for m in module}) == 1:
                blocks.extend(module)
    return blocks


def _is_repeated(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1


def _has_repeated(module: torch.nn.Module) -> bool:
    return any(_is_repeated(m) for m in module.modules())


def _compile_one(module: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """In place; a hooked module compiles the forward its hook calls (the hook stays eager)."""
    if "_hf_hook" in module.__dict__ and "_old_forward" in module.__dict__:
        module.__dict__["_old_forward"] = torch.compile(module.__dict__["_old_forward"], **kwargs)
    else:
        module.compile(**kwargs)


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Regional compilation: each block of a repeated stack (a ModuleList of one class, a
    transformer's layers) is compiled on its own, so dynamo captures one graph and the other blocks
    reuse it; what lies outside the stacks (embeddings, final norm, head) is compiled module by
    module. Unlike Accelerate (which returns compiled shallow copies) it compiles `module` in place
    and returns it, keeping state-dict keys and hooks where they are. `compile_kwargs` go to
    `torch.compile`."""
    if isinstance(module, torch.nn.ModuleList) and _is_repeated(module):
        for block in module:
            _compile_one(block, compile_kwargs)
    elif _has_repeated(module):
        for child in module.children():
            compile_regions(child, **compile_kwargs)
    else:
        _compile_one(module, compile_kwargs)
    return module


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    if plugin.backend in (None, DynamoBackend.NO) or plugin.disable:
        return model
    kwargs = plugin.to_kwargs()
    kwargs.pop("disable", None)
    targets = repeated_blocks(model) if plugin.use_regional_compilation else []
    for block in targets or [model]:
        block.compile(**kwargs)
    return model
