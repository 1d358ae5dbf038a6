"""Walking nested batches (lists, tuples, named tuples, dicts, dataclass-like mappings) of tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """`generator`'s items in a container of `obj`'s type (list, tuple or named tuple)."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


_rebuild = honor_type


def _mapping_type(obj: Mapping) -> Any:
    """The constructor to rebuild a mapping of the same type (dict, OrderedDict, BatchEncoding, ...)."""
    return type(obj)


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = lambda t: isinstance(t, torch.Tensor),
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply `func` to every leaf passing `test_type`, keeping the container types."""
    if isinstance(data, (list, tuple)):
        return _rebuild(
            data,
            [
                recursively_apply(
                    func, o, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for o in data
            ],
        )
    if isinstance(data, Mapping):
        return _mapping_type(data)(
            {
                k: recursively_apply(
                    func, v, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for k, v in data.items()
            }
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        name = getattr(func, "__name__", func)
        raise TypeError(
            f"Unsupported types ({type(data)}) passed to `{name}`. Only nested list/tuple/dicts of objects "
            f"that are valid for `{getattr(test_type, '__name__', test_type)}` should be passed "
            "(here: tensors)."
        )
    return data


def tree_leaves(data: Any) -> list[torch.Tensor]:
    """Every tensor in `data`, in a deterministic (depth-first, insertion) order."""
    leaves: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        leaves.append(t)
        return t

    recursively_apply(collect, data)
    return leaves


def tree_replace(data: Any, new_leaves: list[Any]) -> Any:
    """`data` with its tensors replaced, in `tree_leaves` order, by `new_leaves`."""
    it = iter(new_leaves)
    return recursively_apply(lambda _t: next(it), data)


def is_tensor_tree(data: Any) -> bool:
    """True when `data` has tensors and nothing else at its leaves."""
    others: list[Any] = []
    recursively_apply(
        others.append, data, test_type=lambda t: not isinstance(t, (torch.Tensor, list, tuple, Mapping))
    )
    return not others and bool(tree_leaves(data))


def send_to_device(
    data: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: list[str] | str | None = None,
) -> Any:
    """Move every tensor (and anything with a `.to`) in `data` to `device`."""
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(data, torch.Tensor) or (
        hasattr(data, "to") and not isinstance(data, (Mapping, list, tuple))
    ):
        if isinstance(data, torch.Tensor) and data.device == torch.device(device):
            return data
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:
            return data.to(device)
    if isinstance(data, (list, tuple)):
        return _rebuild(data, [send_to_device(o, device, non_blocking, skip_keys) for o in data])
    if isinstance(data, Mapping):
        skip = set(skip_keys or ())
        return _mapping_type(data)(
            {
                k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
                for k, v in data.items()
            }
        )
    return data


def find_batch_size(data: Any) -> int | None:
    """Size of the first dimension of the first tensor found, or None."""
    for leaf in tree_leaves(data):
        return int(leaf.shape[0]) if leaf.dim() > 0 else None
    return None


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-shaped nested structures leaf by leaf."""
    first = data[0]
    if isinstance(first, (list, tuple)):
        return _rebuild(first, [concatenate([d[i] for d in data], dim) for i in range(len(first))])
    if isinstance(first, Mapping):
        return _mapping_type(first)({k: concatenate([d[k] for d in data], dim) for k in first})
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"can only concatenate tensors, got {type(first).__name__}")
    return torch.cat(data, dim=dim)


def slice_tensors(data: Any, tensor_slice: slice) -> Any:
    return recursively_apply(lambda t: t[tensor_slice], data)


def convert_to_fp32(data: Any) -> Any:
    """Cast fp16/bf16 tensors in `data` to fp32 (outputs of an autocast forward)."""
    return recursively_apply(
        lambda t: t.float(),
        data,
        test_type=lambda t: isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16),
    )
