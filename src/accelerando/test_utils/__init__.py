"""Accelerate's `accelerate.test_utils` for code written against it: the regression toy problem its
test scripts train, and the helpers those scripts import. accelerando's own test helpers are in
`accelerando.testing`."""

from accelerando.test_utils.testing import (
    DEFAULT_LAUNCH_COMMAND,
    are_the_same_tensors,
    assert_exception,
    device_count,
    get_launch_command,
    memory_allocated_func,
    torch_device,
)
from accelerando.test_utils.training import RegressionDataset, RegressionModel

__all__ = [
    "DEFAULT_LAUNCH_COMMAND",
    "RegressionDataset",
    "RegressionModel",
    "are_the_same_tensors",
    "assert_exception",
    "device_count",
    "get_launch_command",
    "memory_allocated_func",
    "torch_device",
]
