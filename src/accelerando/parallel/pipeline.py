"""Pipeline-parallel inference over processes with `torch.distributed.pipelining`.

`prepare_pippy` traces the model once on a micro-batch, cuts it at `split_points` (module names;
"auto" balances parameter bytes over the processes), keeps this rank's stage and replaces
`model.forward` by one GPipe step: rank 0 feeds the inputs, the last rank gets the outputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from accelerando.big_model.device_map import infer_auto_device_map
from accelerando.big_model.sizes import compute_module_sizes, get_max_layer_size


def _process_info() -> tuple[int, int, torch.device]:
    """(rank, world size, device) from the process group; PartialState when none is up yet."""
    if not (dist.is_available() and dist.is_initialized()):
        from accelerando.state import PartialState

        state = PartialState()
        return state.process_index, state.num_processes, torch.device(state.device)
    from accelerando.config import env
    from accelerando.devices import accelerator_device

    device = accelerator_device()
    local = int(env.raw("LOCAL_RANK") or 0)
    target = torch.device("cpu") if device.type == "cpu" else device.torch_device(local)
    return dist.get_rank(), dist.get_world_size(), target


def generate_device_map(
    model: nn.Module,
    num_processes: int = 1,
    no_split_module_classes: Sequence[str] | None = None,
    max_memory: Mapping[int | str, int | str] | None = None,
) -> dict[str, int | str]:
    """Balanced {module: process index} over `num_processes` by parameter bytes (pure)."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    no_split = list(no_split_module_classes or [])
    if max_memory is None:
        sizes = compute_module_sizes(model)
        layer, _ = get_max_layer_size(list(model.named_children()), sizes, no_split)
        share = math.ceil(sizes[""] / num_processes + layer)
        max_memory = {i: share for i in range(num_processes)}
    return infer_auto_device_map(model, max_memory, no_split, clean_result=False)


def _auto_split_points(model: nn.Module, world: int, no_split: Sequence[str] | None) -> list[str]:
    device_map = generate_device_map(model, world, no_split)
    modules = {name for name, _ in model.named_modules()}
    points: list[str] = []
    seen: set[Any] = {0}
    for name, device in device_map.items():
        if device not in seen and isinstance(device, int) and name in modules:
            points.append(name)
            seen.add(device)
    if len(points) != world - 1:
        raise ValueError(
            f"could not cut the model into {world} stages automatically (found split points {points}); "
            "pass split_points= explicitly"
        )
    return points


def find_pippy_batch_size(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    """Batch size of the first tensor in the inputs."""
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _microbatch(data: Any, size: int) -> Any:
    if isinstance(data, torch.Tensor) and data.dim() > 0:
        return data[:size]
    if isinstance(data, (list, tuple)):
        return type(data)(_microbatch(x, size) for x in data)
    if isinstance(data, Mapping):
        return {k: _microbatch(v, size) for k, v in data.items()}
    return data


def build_pipeline(
    model: nn.Module,
    split_points: Sequence[str],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    num_chunks: int,
) -> Any:
    """Trace `model` on one micro-batch, cut it, and return this rank's GPipe schedule."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    kwargs = dict(kwargs or {})
    batch = find_pippy_batch_size(args, kwargs)
    if batch is None or batch % num_chunks:
        raise ValueError(
            f"example inputs have batch size {batch}; it must be a multiple of num_chunks={num_chunks} "
            "(the batch is cut into num_chunks micro-batches)"
        )
    rank, _, device = _process_info()
    pipe = pipeline(
        model,
        mb_args=tuple(_microbatch(list(args), batch // num_chunks)),
        mb_kwargs=_microbatch(kwargs, batch // num_chunks) or None,
        split_spec={point: SplitPoint.BEGINNING for point in split_points},
    )
    stage = pipe.build_stage(rank, device=device)
    return ScheduleGPipe(stage, n_microbatches=num_chunks)


def pippy_forward(
    forward: Callable[..., Any], num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any
) -> Any:
    """One pipelined step: inputs on rank 0, output on the last rank (on all with `gather_output`)."""
    rank, world, _ = _process_info()
    if rank == 0:
        output = forward(*args, **kwargs)
    else:
        output = forward()
    if rank != world - 1:
        output = None
    if gather_output:
        box = [output]
        dist.broadcast_object_list(box, src=world - 1)
        output = box[0]
    return output


def prepare_pippy(
    model: nn.Module,
    split_points: str | Sequence[str] = "auto",
    no_split_module_classes: Sequence[str] | None = None,
    example_args: Sequence[Any] = (),
    example_kwargs: Mapping[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool = False,
) -> nn.Module:
    """Split `model` into one stage per process; calling it then runs the pipeline.

    `example_args`/`example_kwargs` are a full batch of the shape the model will be called with
    (its size must divide by `num_chunks`, which defaults to the number of processes).
    """
    _rank, world, _ = _process_info()
    chunks = world if num_chunks is None else num_chunks
    if chunks < 1:
        raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
    if isinstance(split_points, str):
        if split_points != "auto":
            raise ValueError(f"split_points={split_points!r}: use 'auto' or a list of module names")
        points = _auto_split_points(model, world, no_split_module_classes)
    else:
        points = list(split_points)
        if len(points) != world - 1:
            raise ValueError(f"{len(points)} split point(s) {points} for {world} processes; give {world - 1}")
    schedule = build_pipeline(model, points, tuple(example_args), example_kwargs, chunks)
    attributes = {
        "_original_forward": model.forward,
        "_original_call": model.__call__,
        "pippy_stage": schedule,
        "hf_split_points": points,
        "forward": functools.partial(pippy_forward, schedule.step, chunks, gather_output),
    }
    for name, value in attributes.items():
        setattr(model, name, value)
    return model
