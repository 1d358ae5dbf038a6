"""Accelerate's FSDP checkpoint helpers (`save_fsdp_model` & co.) on accelerando's strategies.

transformers' `Trainer` saves and resumes FSDP runs through these four functions. They use
Accelerate's file names, so a checkpoint folder looks the same whichever library wrote it:

- FULL_STATE_DICT: `pytorch_model_fsdp[_i].bin` and `optimizer[_i].bin` (`torch.save`), written by
  rank 0 from the full state gathered onto its CPU;
- SHARDED_STATE_DICT: `torch.distributed.checkpoint` folders `pytorch_model_fsdp_i/` and
  `optimizer_i/` holding `{"model": ...}` / `{"optimizer": ...}`, written by every rank (so they
  reshard on load); with `use_dcp=False` each rank `torch.save`s its own shards instead
  (`pytorch_model_fsdp_i_rankR.bin`, `optimizer_i_rankR.bin`), loadable only on the same layout.

The tensors come from the accelerator's strategy (`model_state_dict` / `optimizer_state_dict`), the
same ones `save_state` writes, so these work for any strategy (FSDP2, DDP, one process). Each file
or folder appears under its final name only once complete. `adapter_only=True` on a peft model
keeps only the trainable (adapter) tensors, under the model's own key names, both ways.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from accelerando.checkpoint import atomic
from accelerando.checkpoint import state_dict as sd_io
from accelerando.config.fsdp import (
    FULL_STATE_DICT,
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
)
from accelerando.strategies.compose import raw_optimizer
from accelerando.utils.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME
from accelerando.utils.fsdp_merge import merge_fsdp_weights

__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]

logger = logging.getLogger(__name__)
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


# ---- names -------------------------------------------------------------------------------------
def _indexed(stem: str, index: int) -> str:
    return stem if index == 0 else f"{stem}_{index}"


def _full_model_file(index: int) -> str:
    return f"{_indexed(FSDP_MODEL_NAME, index)}.bin"


def _full_optimizer_file(index: int) -> str:
    return f"{_indexed(OPTIMIZER_NAME, index)}.bin"


def _rank_file(stem: str, index: int, rank: int) -> str:
    return f"{stem}_{index}_rank{rank}.bin"


def _dcp_folder(root: str | Path, stem: str, index: int) -> Path:
    """`root/<stem>_<index>`, or `root` itself when the caller named that folder (as Accelerate allows)."""
    name = f"{stem}_{index}"
    root = Path(root)
    return root if root.name == name else root / name


# ---- what to save ------------------------------------------------------------------------------
def _is_full(fsdp_plugin: Any) -> bool:
    kind = getattr(fsdp_plugin, "state_dict_type", None)
    return str(getattr(kind, "name", kind)).rsplit(".", 1)[-1] == FULL_STATE_DICT


def _strategy(accelerator: Any) -> Any:
    strategy = getattr(accelerator, "strategy", None)
    if strategy is None:
        raise TypeError(
            f"accelerator must be an accelerando Accelerator (got {type(accelerator).__name__}); "
            "these helpers save through its strategy"
        )
    return strategy


def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _adapter_keys(strategy: Any, model: torch.nn.Module, adapter_only: bool) -> set[str] | None:
    """With `adapter_only` on a peft model: the names of its trainable tensors; else None (all)."""
    if not adapter_only:
        return None
    inner = strategy.unwrap(model)
    try:
        from peft import PeftModel
    except ImportError:
        return None
    if not isinstance(getattr(inner, "_orig_mod", inner), PeftModel):
        return None
    return {_clean(name) for name, p in inner.named_parameters() if p.requires_grad}


def _only(state: dict[str, Any], keys: set[str] | None) -> dict[str, Any]:
    return state if keys is None else {k: v for k, v in state.items() if k in keys}


def _loads_on_main_only(accelerator: Any) -> bool:
    """FSDP2 reads a full state on rank 0 and broadcasts it; other strategies read it on every rank."""
    return bool(getattr(accelerator, "is_fsdp2", False)) and accelerator.num_processes > 1


# ---- writing -----------------------------------------------------------------------------------
def _write(path: Path, obj: Any) -> None:
    atomic.write_file_atomically(path, lambda tmp: torch.save(obj, tmp))


def _save_dcp(folder: Path, state: dict[str, Any], rank: int) -> None:
    """Every rank writes its shards into a staging folder; rank 0 renames it into place."""
    staged = atomic.staging_path(folder)
    if rank == 0:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if staged.exists():
            import shutil

            shutil.rmtree(staged)
    atomic.barrier()
    sd_io.save_sharded(staged, state)
    atomic.barrier()
    if rank == 0:
        atomic.publish_directory(staged, folder)
    atomic.barrier()


def _read(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} does not exist: was the checkpoint saved with the same state_dict_type "
            "(FULL_STATE_DICT writes .bin files, SHARDED_STATE_DICT folders) and use_dcp setting?"
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def _check_dcp_folder(folder: Path) -> Path:
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} is not a torch.distributed.checkpoint folder (no .metadata): was the "
            "checkpoint saved with state_dict_type=SHARDED_STATE_DICT?"
        )
    return folder


# ---- the four helpers ----------------------------------------------------------------------------
def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: str | Path,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Save `model`'s weights in the plugin's `state_dict_type` (every rank must call it)."""
    strategy = _strategy(accelerator)
    out, rank = Path(output_dir), accelerator.process_index
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    keys = _adapter_keys(strategy, model, adapter_only)
    if _is_full(fsdp_plugin):
        state = _only(strategy.model_state_dict(model, full=True), keys)  # collective
        if rank == 0:
            _write(out / _full_model_file(model_index), state)
            logger.info("Model saved to %s", out / _full_model_file(model_index))
    else:
        state = _only(strategy.model_state_dict(model, full=False), keys)
        if use_dcp:
            _save_dcp(out / f"{FSDP_MODEL_NAME}_{model_index}", {"model": state}, rank)
        else:
            atomic.barrier()  # rank 0 made the folder
            _write(out / _rank_file(FSDP_MODEL_NAME, model_index, rank), state)
    atomic.barrier()


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: str | Path,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> Any:
    """Load weights written by `save_fsdp_model` (same `state_dict_type`) into `model`; every rank calls it.

    Returns what the model's `load_state_dict` returned (missing and unexpected keys).
    """
    strategy = _strategy(accelerator)
    rank = accelerator.process_index
    keys = _adapter_keys(strategy, model, adapter_only)
    strict = keys is None
    atomic.barrier()
    if _is_full(fsdp_plugin):
        path = Path(input_dir) / _full_model_file(model_index)
        main_only = _loads_on_main_only(accelerator)
        state = _read(path) if rank == 0 or not main_only else {}
        result = strategy.load_model_state_dict(model, state, full=True, strict=strict)
    else:
        template = _only(strategy.model_state_dict(model, full=False), keys)
        if use_dcp:
            folder = _check_dcp_folder(_dcp_folder(input_dir, FSDP_MODEL_NAME, model_index))
            state = sd_io.load_sharded(folder, {"model": template})["model"]
        else:
            state = _read(Path(input_dir) / _rank_file(FSDP_MODEL_NAME, model_index, rank))
        result = strategy.load_model_state_dict(model, state, full=False, strict=strict)
    atomic.barrier()
    return result


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    output_dir: str | Path,
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Save the optimizer's state in the plugin's `state_dict_type` (every rank must call it)."""
    strategy = _strategy(accelerator)
    out, rank = Path(output_dir), accelerator.process_index
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    full = _is_full(fsdp_plugin)
    state = strategy.optimizer_state_dict(model, raw_optimizer(optimizer), full=full)  # collective
    if full:
        if rank == 0:
            _write(out / _full_optimizer_file(optimizer_index), state)
    elif use_dcp:
        _save_dcp(out / f"{OPTIMIZER_NAME}_{optimizer_index}", {"optimizer": state}, rank)
    else:
        atomic.barrier()
        _write(out / _rank_file(OPTIMIZER_NAME, optimizer_index, rank), state)
    atomic.barrier()


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    input_dir: str | Path,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load optimizer state written by `save_fsdp_optimizer` (same `state_dict_type`); every rank calls it.

    `adapter_only` is accepted as Accelerate does; an optimizer holds only what it trains anyway.
    """
    strategy = _strategy(accelerator)
    rank = accelerator.process_index
    opt = raw_optimizer(optimizer)
    atomic.barrier()
    if _is_full(fsdp_plugin):
        path = Path(input_dir) / _full_optimizer_file(optimizer_index)
        main_only = _loads_on_main_only(accelerator)
        state = _read(path) if rank == 0 or not main_only else {}
        strategy.load_optimizer_state_dict(model, opt, state, full=True)
    else:
        if use_dcp:
            folder = _check_dcp_folder(_dcp_folder(input_dir, OPTIMIZER_NAME, optimizer_index))
            template = {"optimizer": strategy.optimizer_state_dict(model, opt, full=False)}
            state = sd_io.load_sharded(folder, template)["optimizer"]
        else:
            state = _read(Path(input_dir) / _rank_file(OPTIMIZER_NAME, optimizer_index, rank))
        strategy.load_optimizer_state_dict(model, opt, state, full=False)
    atomic.barrier()
