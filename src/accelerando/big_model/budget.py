"""Memory budgets for device-map planning: what each device may hold, measured or given.

`get_balanced_memory` shrinks accelerator budgets so that a sequential fill spreads a model over
them; it follows Accelerate's arithmetic exactly, so "auto"/"balanced" give the same maps.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from accelerando.big_model.sizes import compute_module_sizes, convert_file_size_to_int, get_module_leaves

logger = logging.getLogger(__name__)

DeviceKey = int | str
_NAMED_DEVICES = ("mps", "cpu", "disk")


def get_max_memory(
    max_memory: Mapping[DeviceKey, float | str] | None = None,
) -> dict[DeviceKey, float]:
    """Budget per device, accelerators first (by index), then "mps", "cpu", "disk".

    Without `max_memory` the machine is measured: free memory of each accelerator and available RAM.
    An accelerator index the machine lacks is kept (plans can be made for another machine) with a
    warning, as Accelerate does.
    """
    if max_memory is None:
        return _measure_memory()
    converted: dict[DeviceKey, float] = {}
    for key, value in max_memory.items():
        if isinstance(key, bool) or not (isinstance(key, int) or key in _NAMED_DEVICES):
            raise ValueError(
                f"Device {key!r} is not recognized, available devices are integers (for GPU/XPU), 'mps', 'cpu' "
                "and 'disk' (a max_memory key names a device)"
            )
        converted[key] = _as_bytes(value)
    indices = sorted(k for k in converted if isinstance(k, int))
    _warn_missing_accelerators(indices)
    order: list[DeviceKey] = [*indices, *(n for n in _NAMED_DEVICES if n in converted)]
    return {k: converted[k] for k in order}


def _as_bytes(value: float | str) -> float:
    """A budget in bytes: strings like "10GiB" are converted; numbers (balanced budgets may be
    fractional) pass through."""
    if isinstance(value, float) and value >= 0:
        return value
    return convert_file_size_to_int(value)  # type: ignore[arg-type]


def _warn_missing_accelerators(indices: Sequence[int]) -> None:
    from accelerando.devices import accelerator_device

    if not indices:
        return
    device = accelerator_device()
    present = [] if device.type in ("cpu", "mps") else list(range(device.device_count()))
    for index in indices:
        if index not in present:
            logger.warning(f"Device {index} is not available, available devices are {present}")


def _measure_memory() -> dict[DeviceKey, float]:
    from accelerando.devices import accelerator_device, get_device

    budget: dict[DeviceKey, float] = {}
    device = accelerator_device()
    if device.type == "mps":
        budget["mps"] = get_device("cpu").mem_get_info()[0]
    elif device.type != "cpu":
        for index in range(device.device_count()):
            budget[index] = device.mem_get_info(index)[0]
    budget["cpu"] = get_device("cpu").mem_get_info()[0]
    return budget


def _accelerator_type() -> str:
    from accelerando.devices import accelerator_device

    return accelerator_device().type


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, float | str] | None = None,
    no_split_module_classes: Sequence[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
) -> dict[DeviceKey, float]:
    """Shrink accelerator budgets so a sequential fill spreads the model evenly over them.

    Every accelerator but the last gets an equal share of the model plus a margin (1.25 x the larger
    of the biggest no-split block and the mean size of the model's innermost modules), so each
    receives about the same number of layers; the last keeps its full budget for what is left.
    With `low_zero` the first accelerator only gets what the others cannot hold (it keeps room for
    `generate()` buffers). Budgets of the cpu, disk and a single accelerator are returned as given,
    except that a measured single accelerator keeps 10 % free.
    """
    measured = max_memory is None
    budget: dict[DeviceKey, float] = dict(get_max_memory(max_memory))
    on_mps = _accelerator_type() == "mps"
    sharing = [k for k, v in budget.items() if v > 0 and (isinstance(k, int) or (k == "mps" and on_mps))]
    if not sharing:
        return budget
    if len(sharing) == 1:
        low_zero = False
        first = next((k for k in budget if isinstance(k, int)), None)
        if measured and first is not None:
            budget[first] = int(budget[first] * 0.9)
            logger.info(
                f"We will use 90% of the memory on device {first} for storing the model, and 10% for the buffer "
                "to avoid OOM. You can set `max_memory` to a higher value to use more memory (at your own risk)."
            )
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    classes = (
        [no_split_module_classes] if isinstance(no_split_module_classes, str) else no_split_module_classes
    )
    margin = max(_first_block_size(model, sizes, list(classes or [])), _mean_inner_module_size(sizes))
    share = sizes[""] // (len(sharing) - 1 if low_zero else len(sharing)) + int(1.25 * margin)
    gpus = sorted(k for k, v in budget.items() if isinstance(k, int) and v > 0)
    first_gpu = 0 if 0 in budget else (gpus[0] if gpus else None)
    for index in gpus[:-1]:
        if not (low_zero and index == first_gpu):
            budget[index] = min(share, budget[index])
    if low_zero and first_gpu is not None:
        rest = sum(budget[i] for i in gpus[1:])
        budget[first_gpu] = min(max(0, sizes[""] - rest), budget[first_gpu])
    return budget


def _first_block_size(model: nn.Module, sizes: Mapping[str, float], classes: Sequence[str]) -> float:
    """The largest, over `classes`, of the size of the first module of that class (in tensor order)."""
    found: dict[str, float] = {}
    for name, size in sizes.items():
        if not name or len(found) == len(set(classes)):
            continue
        kind = type(functools.reduce(getattr, name.split("."), model)).__name__
        if kind in classes and kind not in found:
            found[kind] = size
    return max(found.values(), default=0)


def _mean_inner_module_size(sizes: Mapping[str, float]) -> int:
    """Mean size of the innermost modules (the leaves once the tensors themselves are set aside)."""
    tensors = set(get_module_leaves(sizes))
    modules = {n: v for n, v in sizes.items() if n not in tensors}
    inner = get_module_leaves(modules)
    return int(sum(modules[n] for n in inner) / max(len(inner), 1))
