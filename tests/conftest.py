"""Shared fixtures: a clean runtime per test and no leaked environment variables."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_runtime_and_env():
    before = dict(os.environ)
    yield
    from accelerando.state import reset_runtime

    reset_runtime(destroy_process_group=True)
    leaked = {
        k for k in os.environ if k not in before and k.startswith(("ACCELERANDO_", "ACCELERATE_", "FSDP_"))
    }
    for key in set(os.environ) - set(before):
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    assert not leaked, f"test leaked environment variables: {sorted(leaked)}"
