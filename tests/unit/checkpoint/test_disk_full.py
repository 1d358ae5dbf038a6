"""A save that runs out of space (issue 25): the error says so with the file and the bytes it needs,
the staging folder is removed, and the previous checkpoint still loads.

How the full disk is made without filling the machine's disk: the kernel's per-process file-size
limit (RLIMIT_FSIZE) is lowered around the failing save, so the real write path (our writers, torch's
zip writer, the kernel) fails for real, with EFBIG instead of ENOSPC. The ENOSPC wording itself is
checked by raising ENOSPC at the OS-error level from inside a write.
"""

from __future__ import annotations

import errno
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Setup

from accelerando import ProjectConfiguration
from accelerando.checkpoint.diskspace import OutOfSpaceError


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """Files of this process cannot grow past `nbytes` (writes fail with EFBIG, not SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _staging_left(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if p.name.endswith(".incomplete")]


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "torch.save"])
def test_file_size_limit_during_save_state(tmp_path: Path, safe: bool) -> None:
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    s = Setup(project_config=project)
    s.step(2)
    first = s.acc.save_state(safe_serialization=safe)
    saved = s.params()
    s.step(2)
    with file_size_limit(200), pytest.raises(OutOfSpaceError) as info:
        s.acc.save_state(safe_serialization=safe)
    err = info.value
    model_file = "model.safetensors" if safe else "pytorch_model.bin"
    assert err.errno == errno.EFBIG and "no space left" in str(err)
    assert Path(err.filename).name == model_file, err.filename
    needs = int(str(err).split("it needs ")[1].split(" bytes")[0].replace(",", ""))
    assert needs == (Path(first) / model_file).stat().st_size  # the same shapes: the same size
    assert "checkpoint_1" in str(err) and ".checkpoint_1.incomplete was removed" in str(err)
    assert _staging_left(tmp_path) == []
    s.acc.load_state()  # the newest complete checkpoint: the first one, intact
    assert s.acc.project_configuration.iteration == 1
    assert all(torch.equal(a, b) for a, b in zip(saved, s.model.parameters()))
    assert Path(first).name == "checkpoint_0"
    s.acc.save_state(safe_serialization=safe)  # space back: the next save works
    assert (tmp_path / "checkpoints" / "checkpoint_1" / "manifest.json").is_file()


def test_enospc_is_named_as_no_space_left(tmp_path: Path, setup: Setup) -> None:
    def full_disk(models: list, weights: list, output_dir: str) -> None:
        Path(output_dir, "extra.bin").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(output_dir, "extra.bin")))

    setup.acc.register_save_state_pre_hook(full_disk)
    with pytest.raises(OutOfSpaceError, match="no space left on the device") as info:
        setup.acc.save_state(str(tmp_path / "ck"))
    assert info.value.errno == errno.ENOSPC and info.value.filename.endswith("extra.bin")
    assert not (tmp_path / ".ck.incomplete").exists() and not (tmp_path / "ck").exists()


def test_file_size_limit_during_save_model(tmp_path: Path, setup: Setup) -> None:
    """`save_model` (an export, not a checkpoint) fails the same way and keeps the previous export."""
    out = tmp_path / "export"
    setup.acc.save_model(setup.model, str(out))
    before = (out / "model.safetensors").read_bytes()
    setup.step()
    with file_size_limit(200), pytest.raises(OutOfSpaceError, match="no space left") as info:
        setup.acc.save_model(setup.model, str(out))
    assert Path(info.value.filename).name == "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]  # no staging left
