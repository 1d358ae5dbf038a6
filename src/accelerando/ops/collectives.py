"""Collectives over nested structures of tensors, safe against mismatched shapes.

Every gather first exchanges a small signature (dtype and shape of each leaf). Leaves that differ
only in their first dimension are padded, gathered and trimmed; any other mismatch raises a
`DistributedOperationException` (a ValueError) naming each rank's shapes instead of hanging or failing
deep inside the backend. In Accelerate's debug mode (`PartialState().debug = True`) gather, reduce,
broadcast and pad_across_processes first require identical shapes on every rank, as Accelerate does,
and ranks that call different collectives (or some none) get an error naming each call site
(`announce.py`) instead of a hang.

Every collective takes a `group`; None means the data-parallel group of the job's mesh (the
default group until tensor or context parallelism splits the ranks), and the default group when
no Accelerator has configured the process.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from accelerando import _runtime
from accelerando.ops.announce import announce
from accelerando.ops.errors import MISMATCH, CannotPadNestedTensorWarning, DistributedOperationException
from accelerando.ops.tree import recursively_apply, tree_leaves, tree_replace

_MAX_DIMS = 8
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]  # fmt: skip


def data_parallel_group() -> Any:
    """The configured strategy's data-parallel group; None (the default group) when it spans the world."""
    runtime = _runtime.current()
    strategy = runtime.strategy if runtime is not None else None
    return strategy.ctx.mesh.data_parallel_group() if strategy is not None else None


def _group(group: Any) -> Any:
    return data_parallel_group() if group is None else group


def _world(group: Any = None) -> int:
    """The group's size; 1 in a single process. A distributed runtime whose group is gone raises:
    answering 1 turned every rank's collective into a silent local no-op after `end_training()`."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    runtime = _runtime.current()
    if runtime is not None and runtime.topology.world_size > 1:
        raise RuntimeError(
            f"this process's group of {runtime.topology.world_size} ranks was destroyed "
            "(end_training() or destroy_process_group()), so collectives can no longer run; to train "
            "again in the same processes, call accelerando.state.reset_runtime() on every rank, then "
            "create a new Accelerator"
        )
    return 1


def _verify_in_debug(operation: str, data: Any, group: Any) -> None:
    """Debug mode: every rank must pass the same structure and shapes (Accelerate's op checker)."""
    runtime = _runtime.current()
    if runtime is None or not runtime.debug or _world(group) == 1:
        return
    shapes: Any = (
        list(data.shape) if isinstance(data, torch.Tensor) else [list(t.shape) for t in tree_leaves(data)]
    )
    entries = announce(operation, shapes) if _world(group) == _world() else None
    if entries is not None:  # the world group: announced with call sites and a deadline
        everyone: list[Any] = [e["shapes"] for e in entries]
    else:
        everyone = [None] * _world(group)
        dist.all_gather_object(everyone, shapes, group=group)
    if any(s != everyone[0] for s in everyone):
        listing = "\n  - ".join(f"Process {i}: {s}" for i, s in enumerate(everyone))
        raise DistributedOperationException(
            "Cannot apply desired operation due to shape mismatches. All shapes across devices must be "
            f"valid.\n\nOperation: `accelerando.utils.operations.{operation}`\nInput shapes:\n  - {listing}"
        )


def _signature(leaves: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    rows = []
    for t in leaves:
        if t.dim() > _MAX_DIMS:
            raise ValueError(f"cannot gather a tensor with {t.dim()} dimensions (at most {_MAX_DIMS})")
        code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else len(_DTYPES)
        rows.append([code, t.dim(), *t.shape, *([-1] * (_MAX_DIMS - t.dim()))])
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(-1)


def _all_gather_same(t: torch.Tensor, group: Any) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(_world(group))]
    dist.all_gather(out, t, group=group)
    return out


def _check_signatures(leaves: list[torch.Tensor], group: Any) -> list[list[tuple[int, ...]]]:
    """Shapes of every leaf on every rank; raises when structures or trailing dims disagree."""
    device = leaves[0].device if leaves else torch.device("cpu")
    counts = [int(c) for c in _all_gather_same(torch.tensor([len(leaves)], device=device), group)]
    if len(set(counts)) > 1:
        raise DistributedOperationException(f"{MISMATCH} Ranks passed different numbers of tensors: {counts}")
    if not leaves:
        return []
    sigs = [s.view(len(leaves), -1).tolist() for s in _all_gather_same(_signature(leaves, device), group)]
    shapes: list[list[tuple[int, ...]]] = []
    for i in range(len(leaves)):
        per_rank = [tuple(row[i][2 : 2 + row[i][1]]) for row in sigs]
        dtypes = {row[i][0] for row in sigs}
        trailing = {s[1:] for s in per_rank}
        ndims = {len(s) for s in per_rank}
        if len(dtypes) > 1 or len(ndims) > 1 or len(trailing) > 1:
            listing = ", ".join(f"rank {r}: {tuple(s)}" for r, s in enumerate(per_rank))
            raise DistributedOperationException(
                f"{MISMATCH} Cannot gather tensor #{i}: its shape or dtype differs across ranks beyond the first "
                f"dimension ({listing}); pad it with pad_across_processes first"
            )
        shapes.append(per_rank)
    return shapes


def _gather_leaf(t: torch.Tensor, shapes: list[tuple[int, ...]], group: Any) -> torch.Tensor:
    longest = max(s[0] for s in shapes)
    if all(s[0] == longest for s in shapes):
        return torch.cat(_all_gather_same(t.contiguous(), group), dim=0)
    padded = t.new_zeros((longest, *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = _all_gather_same(padded, group)
    return torch.cat([p[: s[0]] for p, s in zip(parts, shapes)], dim=0)


def gather(data: Any, group: Any = None) -> Any:
    """Concatenate every rank's tensors along dim 0 (0-dim tensors become one row per rank)."""
    group = _group(group)
    if _world(group) == 1:
        return recursively_apply(lambda t: t[None] if t.dim() == 0 else t, data)
    _verify_in_debug("gather", data, group)
    leaves = [t[None] if t.dim() == 0 else t for t in tree_leaves(data)]
    shapes = _check_signatures(leaves, group)
    return tree_replace(data, [_gather_leaf(t, s, group) for t, s in zip(leaves, shapes)])


def gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's object; lists are concatenated rank after rank."""
    group = _group(group)
    world = _world(group)
    if world == 1:
        return list(obj) if isinstance(obj, list) else [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    if isinstance(obj, list):
        return [item for part in out for item in part]
    return out


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0, group: Any = None) -> Any:
    """All-reduce every tensor with 'sum', 'mean', 'max' or 'none' (local), then multiply by `scale`."""
    if reduction not in ("sum", "mean", "max", "none"):
        raise ValueError(f"reduction={reduction!r} is not supported; accepted: 'sum', 'mean', 'max', 'none'")
    group = _group(group)
    world = _world(group)

    def one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if world > 1 and reduction != "none":
            op = dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM
            dist.all_reduce(out, op=op, group=group)
            if reduction == "mean":
                out = out / world
        return out * scale if scale != 1.0 else out

    if world > 1 and reduction != "none":
        _verify_in_debug("reduce", data, group)
        _check_same_shapes(tree_leaves(data), "reduce", group)
    return recursively_apply(one, data, error_on_other_type=True)


def _check_same_shapes(leaves: list[torch.Tensor], what: str, group: Any) -> None:
    for i, shapes in enumerate(_check_signatures(leaves, group)):
        if len(set(shapes)) > 1:
            listing = ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
            raise DistributedOperationException(
                f"{MISMATCH} Cannot {what} tensor #{i}: shapes differ across ranks ({listing})"
            )


def broadcast(data: Any, from_process: int = 0, group: Any = None) -> Any:
    """Every rank gets `from_process`'s tensors (a global rank; in place, shapes must already agree)."""
    group = _group(group)
    if _world(group) == 1:
        return data
    _verify_in_debug("broadcast", data, group)
    _check_same_shapes(tree_leaves(data), "broadcast", group)

    def one(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        dist.broadcast(t, src=from_process, group=group)
        return t

    return recursively_apply(one, data, error_on_other_type=True)


def broadcast_object_list(object_list: list[Any], from_process: int = 0, group: Any = None) -> list[Any]:
    """Picklable objects from `from_process` (a global rank), written into `object_list` on every rank."""
    group = _group(group)
    if _world(group) > 1:
        dist.broadcast_object_list(object_list, src=from_process, group=group)
    return object_list


def pad_across_processes(
    data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False, group: Any = None
) -> Any:
    """Pad each tensor along `dim` to the largest size any rank has (nested tensors are left as they are)."""
    group = _group(group)
    world = _world(group)
    _verify_in_debug("pad_across_processes", data, group)

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.is_nested:
            warnings.warn(
                "Cannot pad nested tensors without more information. Leaving unprocessed.",
                CannotPadNestedTensorWarning,
                stacklevel=4,
            )
            return t
        if world == 1 or dim >= t.dim() or dim < -t.dim():
            return t
        sizes = _all_gather_same(torch.tensor([t.shape[dim]], device=t.device), group)
        longest = int(max(s.item() for s in sizes))
        if longest == t.shape[dim]:
            return t
        new_shape = list(t.shape)
        new_shape[dim] = longest
        out = t.new_full(new_shape, pad_index)
        index = [slice(None)] * t.dim()
        index[dim] = slice(longest - t.shape[dim], longest) if pad_first else slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    return recursively_apply(one, data, error_on_other_type=world > 1)
