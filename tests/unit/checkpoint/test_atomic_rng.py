"""Building blocks: manifest round trip, staging names, RNG capture/restore, public module names."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from accelerando import checkpointing
from accelerando.checkpoint import rng
from accelerando.checkpoint.atomic import (
    CheckpointError,
    Manifest,
    StagedCheckpoint,
    crc32_file,
    is_complete,
    staging_path,
)


def test_staged_publish_and_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    for payload in (b"first", b"second!"):
        stage = StagedCheckpoint(target, is_writer=True).open()
        assert stage.path == staging_path(target.absolute())
        stage.write("a.bin", lambda p, b=payload: p.write_bytes(b))
        stage.write("sub/b.pt", {"x": torch.ones(2)})
        stage.publish(world_size=1, extra={})
    manifest = checkpointing.validate_checkpoint(target)
    assert (target / "a.bin").read_bytes() == b"second!"
    assert manifest.files["a.bin"].crc32 == crc32_file(target / "a.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_publish_refuses_a_gather_that_missed_ranks(tmp_path: Path) -> None:
    """A save for 2 ranks whose gather saw only this rank (the process group was destroyed under an
    asynchronous save: a failing rank's worker tears it down while the save thread finishes) publishes
    nothing; a manifest written then omitted random_states_1.pkl, and the restarted job's rank 1 failed
    reading it (FileNotFoundError) after validation passed."""
    target = tmp_path / "ck"
    stage = StagedCheckpoint(target, is_writer=True).open()
    stage.write("random_states_0.pkl", {"x": torch.ones(2)})
    with pytest.raises(CheckpointError, match="1 of 2 ranks"):
        stage.publish(world_size=2, extra={})
    assert not is_complete(target) and not target.exists()
    assert list(tmp_path.iterdir()) == [], "the staging directory is removed"


def test_rng_round_trip_weights_only(tmp_path: Path) -> None:
    state = rng.capture_rng_state()
    torch.save(state, tmp_path / "r.pkl")
    want = (random.random(), np.random.rand(), torch.rand(1))
    rng.restore_rng_state(torch.load(tmp_path / "r.pkl", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1)) == want
    with pytest.raises(ValueError, match="random states"):
        rng.validate_rng_state({"python": 1}, "x.pkl")


def test_custom_state_helpers(tmp_path: Path) -> None:
    sched_owner = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    checkpointing.save_custom_state(sched_owner, tmp_path, index=3)
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    checkpointing.load_custom_state(other, tmp_path, index=3)
    assert other.param_groups[0]["lr"] == 0.5
    assert checkpointing.latest_checkpoint(tmp_path) is None
