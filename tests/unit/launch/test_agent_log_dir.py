"""The agent's log folder: the user's `--log_dir` is kept; the launcher's own temporary one is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelerando.launch.torchrun import agent_log_dir


def test_without_log_dir_a_temporary_folder_is_removed_even_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    with pytest.raises(RuntimeError, match="agent failed"), agent_log_dir(None) as folder:
        assert Path(folder).parent == tmp_path and Path(folder).is_dir()
        (Path(folder) / "attempt_0").mkdir()  # what the agent writes: error files, --tee logs
        raise RuntimeError("agent failed")
    assert list(tmp_path.iterdir()) == []


def test_the_users_log_dir_is_kept(tmp_path: Path) -> None:
    chosen = tmp_path / "logs"
    with agent_log_dir(str(chosen)) as folder:
        assert folder == str(chosen)
        chosen.mkdir()
        (chosen / "stdout.log").write_text("kept")
    assert (chosen / "stdout.log").read_text() == "kept"
