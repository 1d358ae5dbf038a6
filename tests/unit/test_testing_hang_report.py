"""A hung launch in a test ends with every rank's Python stack in the failure, not just "timed out"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from accelerando.testing.distributed import _end_hung

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

RANK = textwrap.dedent(
    """
    import time
    def waiting_for_a_peer_that_never_sends():
        print("rank up", flush=True)
        time.sleep(600)
    waiting_for_a_peer_that_never_sends()
    """
)
AGENT = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {RANK!r}])\ntime.sleep(600)\n"


def test_a_hung_rank_prints_its_stack_and_the_whole_tree_ends() -> None:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert agent.stdout is not None
    assert agent.stdout.readline() == "rank up\n"  # the rank is in its wait
    start = time.monotonic()
    out, errs = _end_hung(agent)
    assert time.monotonic() - start < 20
    assert "in waiting_for_a_peer_that_never_sends" in errs
    assert agent.returncode is not None
