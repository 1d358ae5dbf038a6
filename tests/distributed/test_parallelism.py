"""ParallelismConfig on 2 real gloo ranks: tensor parallelism (MLP with the user's plan, a Llama with its
own), data following the mesh, HSDP on a (1, 2) mesh and DDP from dp_replicate_size. One launch."""

from __future__ import annotations

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_tensor_parallel_hsdp_and_data_follow_the_mesh() -> None:
    proc = run_distributed(SCRIPTS / "tp_mesh.py", timeout=240)
    for marker in ("TP_MLP_OK", "TP_LLAMA_OK", "HSDP_DDP_OK", "TP_MESH_OK"):
        assert marker in proc.stdout, marker
