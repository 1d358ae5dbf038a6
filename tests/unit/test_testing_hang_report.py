"""The tests' launcher: a hung launch ends with every rank's Python stack in the failure, not just
"timed out"; and a launch cannot hang on a rendezvous port that something else took."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from accelerando.testing import distributed
from accelerando.testing.distributed import _end_hung, run_distributed

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


def test_a_launch_never_waits_on_a_port_that_another_socket_took(monkeypatch, tmp_path) -> None:
    """A port picked before the agent starts could be taken meanwhile; torch then joined it as a
    client and waited, silent, until the timeout (the rare empty-output data_resume timeout)."""
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(8)  # accepts connections, never answers, as a store that is not a store
    monkeypatch.setattr(distributed, "free_port", lambda: squatter.getsockname()[1])
    script = tmp_path / "hello.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print(f'rank {dist.get_rank()} of {dist.get_world_size()}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    try:
        proc = run_distributed(script, timeout=90)
    finally:
        squatter.close()
    assert "rank 0 of 2" in proc.stdout and "rank 1 of 2" in proc.stdout
