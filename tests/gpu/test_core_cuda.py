"""Core checks that need CUDA (run on the GPU machine: `pytest -m cuda tests/gpu`)."""

import pytest
import torch

from accelerando import Accelerator, GradScalerKwargs
from accelerando.utils import set_seed

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_training_matches_plain_pytorch_on_cuda(precision):
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    ref.load_state_dict(model.state_dict())
    handlers = [GradScalerKwargs(init_scale=1024.0)]
    acc = Accelerator(mixed_precision=precision, kwargs_handlers=handlers)
    assert acc.device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, enabled=precision == "fp16")
    model, opt = acc.prepare(model, opt)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    for _ in range(3):
        x, y = torch.randn(16, 32, device="cuda"), torch.randn(16, 1, device="cuda")
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = ref(x)
        scaler.scale(torch.nn.functional.mse_loss(out.float(), y)).backward()
        scaler.step(ref_opt)
        scaler.update()
        ref_opt.zero_grad()
    for p, q in zip(acc.unwrap_model(model).parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5), (p - q).abs().max()


def test_device_follows_local_rank_on_cuda(monkeypatch):
    from accelerando.testing import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    acc = Accelerator()
    assert acc.device == torch.device("cuda", 0)
    assert torch.equal(acc.gather(torch.ones(2, device="cuda")), torch.ones(2, device="cuda"))
