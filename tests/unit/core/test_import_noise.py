"""Importing accelerando, then torchao (as transformers does), prints nothing but the user's output."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from accelerando._import_noise import _TorchaoNoise
from accelerando.config import env

SNIPPET = """
import accelerando, torchao, torchao.float8
from accelerando._import_noise import _TorchaoNoise
print("dropped", _TorchaoNoise.dropped)
"""


def test_torchao_kernel_library_lines_are_dropped() -> None:
    pytest.importorskip("torchao")
    proc = subprocess.run([sys.executable, "-c", SNIPPET], env=env.snapshot(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.strip() == "dropped 0":
        pytest.skip("this torchao install loads its kernel libraries: nothing to silence")
    assert proc.stderr.strip() == "", proc.stderr


def test_only_those_lines_are_dropped() -> None:
    keep = _TorchaoNoise()

    def record(name: str, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)

    assert not keep.filter(record("torchao", "Failed to load /x/torchao/_C_mxfp8.abi3.so: Could not load"))
    assert keep.filter(record("torchao", "Failed to load the config"))
    assert keep.filter(record("torchao", "something else went wrong"))
    assert keep.filter(
        record("torch.utils._pytree", "<enum 'X'> is an Enum subclass and is now natively supported")
    )
