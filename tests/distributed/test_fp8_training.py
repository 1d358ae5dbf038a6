"""torchao fp8 on 2 real gloo ranks: tensorwise and rowwise, under DDP and FSDP2 (with fp8
all-gather), each against bf16 on the same data; under DeepSpeed ZeRO-2/3, equal to torchao +
`deepspeed.initialize` by hand. One torchrun launch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from accelerando.testing import run_distributed

pytest.importorskip("torchao")


def test_torchao_fp8_trains_with_ddp_and_fsdp2_close_to_bf16() -> None:
    proc = run_distributed(Path(__file__).parent / "scripts" / "fp8_train.py", timeout=240)
    assert "FP8_TRAIN_OK" in proc.stdout
    for line in ("DDP   tensorwise", "DDP   rowwise", "FSDP2 tensorwise", "FSDP2 rowwise"):
        assert line in proc.stdout
    if importlib.util.find_spec("deepspeed") is not None:
        assert "ZeRO-2 tensorwise" in proc.stdout and "ZeRO-3 rowwise" in proc.stdout, proc.stdout
