"""DeepSpeed on CUDA with nccl (run on the GPU machine: `bash tests/gpu/run_gpu_checks.sh`).

One torchrun launch over min(2, GPUs) ranks (one H200: one rank, nccl on one GPU) runs:
  * fp32 ZeRO-2 == DDP (1e-5);
  * bf16 ZeRO-3 (mixed_precision="bf16"): bf16 module weights, fp32 master copies, training that
    tracks the fp32 reference as closely as bf16 allows; save_model gives whole bf16 tensors;
  * ZeRO-3 with parameters and optimizer state offloaded to CPU == DDP (1e-5), with a save_state ->
    load_state round trip that resumes bit-identically.
Skipped without CUDA. The launched script also runs on CPU (`python -m torch.distributed.run
--nproc_per_node 2 tests/gpu/test_deepspeed_cuda.py DIR`), which checks its logic without a GPU.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed in this environment: DS_BUILD_OPS=0 pip install deepspeed",
    ),
]


def test_deepspeed_on_cuda(tmp_path: Path) -> None:
    from accelerando.testing import run_distributed

    nproc = min(2, torch.cuda.device_count())
    proc = run_distributed(__file__, args=(str(tmp_path),), nproc=nproc, timeout=400)
    assert "DEEPSPEED_CUDA_OK" in proc.stdout, proc.stdout[-4000:]


# ---- the launched script ----------------------------------------------------------------------
DIM, ROWS, STEPS = 64, 8, 4


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM), torch.nn.Linear(DIM, 1)
    )


def _batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(ROWS, DIM, generator=g).to(device), torch.randn(ROWS, 1, generator=g).to(device)


def _loader(rank: int) -> torch.utils.data.DataLoader:
    """Only its batch size matters (DeepSpeed's train_micro_batch_size_per_gpu is "auto")."""
    return torch.utils.data.DataLoader(torch.zeros(ROWS * 4, 1), batch_size=ROWS)


def _ddp_reference(base: torch.nn.Module, rank: int, device: torch.device) -> dict[str, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(copy.deepcopy(base).to(device), device_ids=ids)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        x, y = _batch(step, rank, device)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().float().cpu() for k, v in model.module.state_dict().items()}


def _train(acc, model, opt, rank, device, steps=STEPS, start=0, dtype=None):  # type: ignore[no-untyped-def]
    losses = []
    for step in range(start, start + steps):
        x, y = _batch(step, rank, device)
        x = x if dtype is None else x.to(dtype)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _full(acc, model) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    state = acc.get_state_dict(model)  # collective: ZeRO-3 gathers on every rank
    box = [state if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return {k: v.float() for k, v in box[0].items()}  # type: ignore[union-attr]


def _fresh_accelerator(**kwargs):  # type: ignore[no-untyped-def]
    from accelerando import Accelerator
    from accelerando.state import reset_runtime

    reset_runtime()  # each check picks its own precision
    return Accelerator(**kwargs)


def main(work: Path) -> None:
    import torch.distributed as dist

    from accelerando.utils import DeepSpeedPlugin

    cuda = torch.cuda.is_available()
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if not dist.is_initialized():  # with one GPU torchrun's world is 1: join the group ourselves
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    base = _net()
    reference = _ddp_reference(base, rank, device)

    # fp32 ZeRO-2 == DDP.
    acc = _fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, _ = acc.prepare(model, opt, _loader(rank))
    assert next(model.module.parameters()).device.type == device.type
    assert dist.get_backend() == ("nccl" if cuda else "gloo")
    _train(acc, model, opt, rank, device)
    for k, v in _full(acc, model).items():
        torch.testing.assert_close(v, reference[k], rtol=1e-5, atol=1e-5, msg=f"ZeRO-2 {k}")
    acc.free_memory()
    acc.print("zero2 fp32 OK")

    # bf16 ZeRO-3: the engine keeps bf16 weights and fp32 master partitions.
    acc = _fresh_accelerator(
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False), mixed_precision="bf16"
    )
    assert acc.state.deepspeed_plugin.deepspeed_config["bf16"]["enabled"] is True
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, _ = acc.prepare(model, opt, _loader(rank))
    assert all(p.dtype == torch.bfloat16 for p in model.module.parameters())
    masters = opt.optimizer.fp32_partitioned_groups_flat  # ZeRO-3's fp32 master partitions
    assert masters and all(p.dtype == torch.float32 for p in masters), [p.dtype for p in masters]
    _train(acc, model, opt, rank, device, dtype=torch.bfloat16)
    got = _full(acc, model)
    start = {k: v.float() for k, v in base.state_dict().items()}
    for k, want in reference.items():
        moved = (want - start[k]).abs().mean().item()
        off = (got[k] - want).abs().mean().item()
        assert off < 0.1 * moved, (
            f"bf16 {k}: mean |deepspeed - fp32 reference| {off:.2e} vs moved {moved:.2e}"
        )
    acc.save_model(model, str(work / "bf16"))
    if rank == 0:
        from safetensors.torch import load_file

        saved = load_file(str(work / "bf16" / "model.safetensors"))
        assert all(
            v.dtype == torch.bfloat16 and v.shape == base.state_dict()[k].shape for k, v in saved.items()
        )
    acc.free_memory()
    acc.print("zero3 bf16 OK")

    # ZeRO-3 with parameters and optimizer state on CPU == DDP; save -> load resumes bit-identically.
    plugin = DeepSpeedPlugin(
        zero_stage=3, offload_param_device="cpu", offload_optimizer_device="cpu", zero3_init_flag=False
    )
    acc = _fresh_accelerator(deepspeed_plugin=plugin)
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, _ = acc.prepare(model, opt, _loader(rank))
    assert all(p.ds_tensor.device.type == "cpu" for p in model.module.parameters())
    assert model.config["zero_force_ds_cpu_optimizer"] is False  # the torch optimizer runs on CPU, no JIT op
    _train(acc, model, opt, rank, device)
    for k, v in _full(acc, model).items():
        torch.testing.assert_close(v, reference[k], rtol=1e-5, atol=1e-5, msg=f"ZeRO-3 offload {k}")
    folder = acc.save_state(str(work / "ckpt"))
    after = _train(acc, model, opt, rank, device, steps=2, start=STEPS)
    weights_after = _full(acc, model)
    acc.load_state(folder)
    again = _train(acc, model, opt, rank, device, steps=2, start=STEPS)
    assert again == after, (again, after)
    for k, v in _full(acc, model).items():
        assert torch.equal(v, weights_after[k]), k
    acc.free_memory()
    acc.print("zero3 offload OK")
    dist.barrier()
    acc.print("DEEPSPEED_CUDA_OK")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
