"""torch.compile of prepared models: in place (`Module.compile`), whole model or repeated blocks.

Compiling in place keeps the module's type and its state-dict keys (no `_orig_mod.` prefix),
so checkpoints look the same compiled or not.
"""

from __future__ import annotations

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


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    if plugin.backend in (None, DynamoBackend.NO) or plugin.disable:
        return model
    kwargs = plugin.to_kwargs()
    kwargs.pop("disable", None)
    targets = repeated_blocks(model) if plugin.use_regional_compilation else []
    for block in targets or [model]:
        block.compile(**kwargs)
    return model
