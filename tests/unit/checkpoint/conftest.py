"""Fixtures for the checkpoint unit tests."""

from __future__ import annotations

import pytest
from ckpt_helpers import Setup


@pytest.fixture
def setup() -> Setup:
    return Setup()
