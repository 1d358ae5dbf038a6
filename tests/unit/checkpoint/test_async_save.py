"""save_state(async_save=True) in one process: same files as a synchronous save, automatic naming
and total_limit applied when the background write ends, and a clear refusal where unsupported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_helpers import Setup

from accelerando import ProjectConfiguration
from accelerando.checkpoint.naming import list_checkpoints


def _files(path: str) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())["files"]


def test_async_equals_sync_and_resumes(setup: Setup, tmp_path: Path) -> None:
    setup.step(2)
    sync = setup.acc.save_state(str(tmp_path / "sync"))
    pending = setup.acc.save_state(str(tmp_path / "async"), async_save=True)
    setup.step(3)  # training goes on, changing every tensor the snapshot copied
    after = setup.params()
    setup.acc.load_state(pending)  # waits for the background write first
    assert _files(sync) == _files(pending)
    setup.step(3)
    assert all(a.equal(b) for a, b in zip(after, setup.model.parameters()))
    assert setup.counter.value == 5


def test_async_automatic_naming_and_limit(tmp_path: Path) -> None:
    cfg = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    s = Setup(project_config=cfg)
    for _ in range(3):
        s.step()
        s.acc.save_state(async_save=True)  # each waits for the one before
    s.acc.end_training()
    assert [i for i, _ in list_checkpoints(tmp_path / "checkpoints")] == [1, 2]


def test_async_refused_for_engine_formats(setup: Setup, tmp_path: Path, monkeypatch) -> None:
    io = setup.acc.strategy.state_io()
    monkeypatch.setattr(type(io), "name", "deepspeed")
    monkeypatch.setattr(type(setup.acc.strategy), "state_io", lambda self: io)
    with pytest.raises(ValueError, match="async_save=True.*not supported.*'deepspeed'"):
        setup.acc.save_state(str(tmp_path / "x"), async_save=True)
    assert not any(tmp_path.iterdir())  # refused before anything was staged


def test_async_save_must_be_a_bool(setup: Setup, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="async_save='yes'.*True and False"):
        setup.acc.save_state(str(tmp_path / "x"), async_save="yes")


def test_host_memory_of_the_snapshot(setup: Setup, tmp_path: Path) -> None:
    """What docs/checkpointing.md states: the weights plus AdamW's two moments, plus small state."""
    setup.step()
    setup.acc.save_state(str(tmp_path / "a"), async_save=True)
    held = setup.acc._checkpointer()._pending.stage.host_bytes
    setup.acc.end_training()
    weights = sum(p.numel() * p.element_size() for p in setup.model.parameters())
    assert 3 * weights <= held < 3 * weights + 64 * 1024, (held, weights)


def test_snapshot_is_the_state_at_the_call(setup: Setup, tmp_path: Path) -> None:
    """The copies deferred to the background thread hold the state save_state saw: the next
    optimizer step waits for them, so what it changes right after the call never leaks in."""
    import threading

    from accelerando.checkpoint import async_save

    setup.step(2)
    ref = setup.acc.save_state(str(tmp_path / "sync"))
    step_started = threading.Event()
    setup.opt.optimizer.register_step_pre_hook(lambda *_: step_started.set())  # runs before ours
    fill = async_save.Snapshot.fill

    def late_fill(self):  # type: ignore[no-untyped-def]
        step_started.wait()  # the copy starts only once the optimizer step is under way
        fill(self)

    async_save.Snapshot.fill = late_fill  # type: ignore[method-assign]
    try:
        pending = setup.acc.save_state(str(tmp_path / "async"), async_save=True)
        setup.step(1)  # mutates every parameter and AdamW moment in place
        setup.acc._checkpointer().wait()
    finally:
        async_save.Snapshot.fill = fill  # type: ignore[method-assign]
    assert _files(pending) == _files(ref)  # same bytes (size, CRC-32 per file) as before the step
    assert setup.acc._checkpointer()._host_buffers.snapshot is None


def test_mutation_outside_optimizer_step_fails_the_save(setup: Setup, tmp_path: Path) -> None:
    """A change that does not wait for the copy is caught by the version counter, not written."""
    import threading

    import torch

    from accelerando.checkpoint import async_save
    from accelerando.checkpoint.atomic import CheckpointError

    setup.step()
    checkpointer = setup.acc._checkpointer()
    snapshot_gate = threading.Event()  # the copy waits until the parameter was changed

    fill = async_save.Snapshot.fill

    def gated(self):  # type: ignore[no-untyped-def]
        snapshot_gate.wait()
        fill(self)

    async_save.Snapshot.fill = gated  # type: ignore[method-assign]
    try:
        pending = setup.acc.save_state(str(tmp_path / "a"), async_save=True)
        with torch.no_grad():
            next(setup.model.parameters()).add_(1.0)
        snapshot_gate.set()
        with pytest.raises(CheckpointError, match="changed in place after save_state"):
            checkpointer.wait()
    finally:
        async_save.Snapshot.fill = fill  # type: ignore[method-assign]
    assert not Path(pending).exists()
