"""Debug mode turns a collective called on some ranks only into an error naming each call site (issue 25)."""

from __future__ import annotations

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPT = Path(__file__).parent / "scripts" / "core_debug_hang.py"


def test_one_sided_collectives_name_every_rank_call_site() -> None:
    env = {"ACCELERANDO_DEBUG_MODE": "1", "ACCELERANDO_DEBUG_COLLECTIVE_TIMEOUT": "3"}
    proc = run_distributed(SCRIPT, env=env, timeout=60)
    assert "DEBUG HANGS ok" in proc.stdout
