"""Skip markers for tests that need particular hardware or packages.

They import pytest only when applied, so `accelerando.testing` (and `run_distributed`) works on an
install without pytest.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, TypeVar

from accelerando.devices import get_device

T = TypeVar("T", bound=Callable[..., Any])


def _skip_unless(condition: bool, reason: str) -> Callable[[T], T]:
    def mark(test: T) -> T:
        import pytest

        return pytest.mark.skipif(not condition, reason=reason)(test)  # type: ignore[no-any-return]

    return mark


def require_cuda(test: T) -> T:
    """Skip the test unless a CUDA device is present."""
    return _skip_unless(get_device("cuda").is_available(), "needs a CUDA device")(test)


def require_multi_cuda(test: T) -> T:
    """Skip the test unless at least two CUDA devices are present."""
    return _skip_unless(get_device("cuda").device_count() >= 2, "needs 2 CUDA devices")(test)


def require_package(name: str) -> Callable[[T], T]:
    """Skip the test unless package `name` can be imported."""
    return _skip_unless(importlib.util.find_spec(name) is not None, f"needs the {name} package")
