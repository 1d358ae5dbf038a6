"""Entries of a manifest or a safetensors index cannot reach outside the checkpoint folder (issue 25)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Setup
from safetensors.torch import save_file

from accelerando.big_model.loading import resolve_checkpoint_files
from accelerando.checkpoint.atomic import MANIFEST_NAME, CheckpointError, validate_checkpoint
from accelerando.checkpoint.confine import UnsafePathError


def _add_entry(ckpt: Path, name: str, target: Path) -> None:
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    manifest["files"][name] = {"size": target.stat().st_size, "crc32": "00000000"}
    (ckpt / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_manifest_entry_outside_the_folder_is_refused(tmp_path: Path, setup: Setup, how: str) -> None:
    ckpt = Path(setup.acc.save_state(str(tmp_path / "run" / "ck")))
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of any checkpoint")
    if how == "dotdot":
        name = "../../../../../../../../.." + str(secret)
    elif how == "absolute":
        name = str(secret)
    else:
        name = "innocent.bin"
        os.symlink(secret, ckpt / name)
    _add_entry(ckpt, name, secret)
    for verify in ("full", "size"):
        with pytest.raises(CheckpointError, match="refused") as info:
            validate_checkpoint(ckpt, verify)
        assert repr(name) in str(info.value)
    with pytest.raises(CheckpointError, match="refused"):
        setup.acc.load_state(str(ckpt))


def _shard(path: Path) -> None:
    save_file({"w": torch.ones(2)}, str(path))


def _index(folder: Path, shard: str) -> Path:
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    return index


def test_index_entry_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    _shard(tmp_path / "outside.safetensors")
    for shard in ("../outside.safetensors", str(tmp_path / "outside.safetensors")):
        with pytest.raises(UnsafePathError, match="refused") as info:
            resolve_checkpoint_files(_index(folder, shard))
        assert repr(shard) in str(info.value)
    os.symlink(tmp_path / "outside.safetensors", folder / "linked.safetensors")
    with pytest.raises(UnsafePathError, match="through a symlink"):
        resolve_checkpoint_files(_index(folder, "linked.safetensors"))


def test_hugging_face_cache_layout_still_loads(tmp_path: Path) -> None:
    """snapshots/<rev>/* are symlinks into blobs/, index included: that is not an escape."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    _shard(blobs / "1111")
    (blobs / "2222").write_text(json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))
    os.symlink("../../blobs/1111", snap / "model-00001.safetensors")
    os.symlink("../../blobs/2222", snap / "model.safetensors.index.json")
    files = resolve_checkpoint_files(snap)
    assert files == [snap / "model-00001.safetensors"]
