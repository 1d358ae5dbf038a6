"""pytest markers for code that needs particular hardware or packages."""

from __future__ import annotations

import importlib.util

import pytest

from accelerando.devices import get_device

require_cuda = pytest.mark.skipif(not get_device("cuda").is_available(), reason="needs a CUDA device")
require_multi_cuda = pytest.mark.skipif(get_device("cuda").device_count() < 2, reason="needs 2 CUDA devices")


def require_package(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(name) is None, reason=f"needs the {name} package")
