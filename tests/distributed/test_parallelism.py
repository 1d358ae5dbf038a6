"""ParallelismConfig on 2 real gloo ranks: tensor parallelism (MLP with the user's plan, a Llama with its
own), data following the mesh, HSDP on a (1, 2) mesh, DDP from dp_replicate_size and context
parallelism (cp_size=2) against the unsharded attention. One launch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_tensor_parallel_hsdp_and_data_follow_the_mesh(tmp_path: Path) -> None:
    proc = run_distributed(SCRIPTS / "tp_mesh.py", args=(str(tmp_path),), timeout=240)
    for marker in (
        "TP_MLP_OK",
        "TP_TO_FSDP_OK",
        "TP_LLAMA_OK",
        "TP_AUTO_OK",
        "HSDP_DDP_OK",
        "CP_OK",
        "TP_MESH_OK",
    ):
        assert marker in proc.stdout, marker
    # The TP-sharded checkpoint loads into one unsharded process (DCP reshards; no process group).
    import torch.distributed.checkpoint as dcp

    expected = torch.load(tmp_path / "expected.pt")
    model = torch.nn.Sequential()
    model.fc1, model.fc2 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt" / "pytorch_model_fsdp_0"))
    assert state["model"].keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(state["model"][key], value, rtol=0, atol=0)
    # save_model wrote the gathered weights as one safetensors file
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "model" / "model.safetensors")
    assert saved.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(saved[key], value, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("ACCELERANDO_TEST_4_RANKS") != "1",
    reason="4 ranks (about 30 s on 2 cores) exceed the CI budget; set ACCELERANDO_TEST_4_RANKS=1 to run",
)
def test_fsdp2_with_tensor_parallelism_on_a_2x2_mesh() -> None:
    proc = run_distributed(SCRIPTS / "tp_fsdp_4ranks.py", nproc=4, timeout=300)
    assert "FSDP_TP_4RANKS_OK" in proc.stdout
