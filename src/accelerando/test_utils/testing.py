"""Helpers Accelerate's test scripts import from `accelerate.test_utils.testing`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from accelerando.devices import accelerator_device


def _backend() -> tuple[str, int, Callable[[], int]]:
    """(device type, how many, allocated-bytes probe) of this machine's accelerator, or the CPU's."""
    device = accelerator_device()
    if device.type == "cpu":
        return "cpu", 1, lambda: 0
    count = max(device.device_count(), 1)
    probe = getattr(device.module(), "memory_allocated", lambda: 0)
    return device.type, count, probe


torch_device, device_count, memory_allocated_func = _backend()


def get_launch_command(**kwargs: Any) -> list[str]:
    """`["accelerate", "launch", "--key=value", "--switch", ...]`: True becomes a bare switch, None is
    left out, anything else (False too) is written `--key=value`."""
    command = ["accelerate", "launch"]
    for key, value in kwargs.items():
        if value is True:
            command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether every process holds a tensor equal to this one (a gather: every process calls it)."""
    from accelerando.state import AcceleratorState
    from accelerando.utils.operations import gather

    mine = tensor[None].clone().to(AcceleratorState().device)
    everyone = gather(mine).cpu()
    return all(torch.equal(row, mine[0].cpu()) for row in everyone)


@contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None) -> Iterator[None]:
    """The block must raise `exception_class` (with `msg` in its text, when given)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - checked against the expected class just below
        assert isinstance(err, exception_class), (
            f"Expected exception of type {exception_class} but got {type(err)}"
        )
        if msg is not None:
            assert msg in str(err), f"Expected message '{msg}' to be in exception but got '{err}'"
        return
    raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")
