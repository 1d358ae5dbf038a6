"""prepare_pippy (torch.distributed.pipelining) on 2 real gloo processes."""

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_prepare_pippy_matches_unsplit_model_on_two_ranks() -> None:
    proc = run_distributed(SCRIPTS / "pipeline_pippy.py", timeout=240)
    assert "pipeline checks passed" in proc.stdout
