"""ParallelismConfig on 2 gloo ranks, one launch: tensor parallelism (tp_size=2) of an MLP with the
user's plan and of a tiny transformers Llama with its own plan, each against the unsharded model
(same seed, same data: loss, gradients and clipping norm at every step at 1e-5; parameters after
three AdamW steps at 1e-4, since Adam's division by sqrt(v) magnifies last-bit differences of
near-zero gradients); the
data follows the mesh (both TP ranks read the same batch, gather_for_metrics once per sample); HSDP
on a (1, 2) mesh and dp_replicate_size=2 (DDP) against a plain DDP reference; the TP checkpoint
(DCP shards) is written to argv[1] for a single-process load and resumed on FSDP2 over dp_shard=2; context parallelism (cp_size=2 with FSDP2)
of a self-attention block against the unsharded block."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_common import assert_close, batch, ddp_reference, full_params, make_net  # noqa: E402

from accelerando import Accelerator  # noqa: E402
from accelerando.config.fsdp import FullyShardedDataParallelPlugin  # noqa: E402
from accelerando.parallelism_config import ParallelismConfig, TorchTensorParallelConfig  # noqa: E402
from accelerando.state import PartialState  # noqa: E402

TOL = 1e-5


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def compare_training(name, model, reference, loss_fn, batches, acc, clip=None):
    """Train the prepared model and the plain reference side by side; everything must agree."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # before prepare, as users do
    model, opt = acc.prepare(model, opt)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for step, data in enumerate(batches):
        loss, ref_loss = loss_fn(model, data), loss_fn(reference, data)
        torch.testing.assert_close(loss.detach(), ref_loss.detach(), rtol=TOL, atol=TOL)
        acc.backward(loss)
        ref_loss.backward()
        grads = {n: full(p.grad) for n, p in model.named_parameters()}
        ref_grads = {n: p.grad.detach() for n, p in reference.named_parameters()}
        assert_close(grads, ref_grads, f"{name} grads step {step}", TOL)
        if clip is not None:
            norm = acc.clip_grad_norm_(model.parameters(), clip)
            ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
            torch.testing.assert_close(full(norm).float(), ref_norm.float(), rtol=TOL, atol=TOL)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    params = {n: full(p) for n, p in model.named_parameters()}
    assert_close(params, dict(reference.named_parameters()), f"{name} params", 1e-4)
    assert any(isinstance(p, DTensor) for p in model.parameters()), f"{name}: nothing was sharded"
    return model, loss.item()


def check_mlp_and_data() -> None:
    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    config = ParallelismConfig(tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=plan))
    acc = Accelerator(parallelism_config=config)
    mesh = acc.torch_device_mesh
    assert mesh is config.device_mesh and mesh["tp"].size() == 2 and mesh["dp"].size() == 1
    assert (acc.data_parallel_size, acc.data_parallel_rank) == (1, 0)
    assert acc.tensor_parallel_rank == mesh["tp"].get_local_rank() == dist.get_rank()

    # data follows the mesh: one data-parallel rank, so both TP ranks read the whole same batch
    data = torch.arange(24, dtype=torch.float32).reshape(12, 2)
    loader = acc.prepare(torch.utils.data.DataLoader(data, batch_size=4))
    batches = [b.clone() for b in loader]
    seen = [None, None]
    dist.all_gather_object(seen, [b.tolist() for b in batches])
    assert seen[0] == seen[1] == [data[i : i + 4].tolist() for i in range(0, 12, 4)], seen
    gathered = torch.cat([acc.gather_for_metrics(b) for b in loader])
    assert torch.equal(gathered, data), gathered  # once per sample, not once per TP rank

    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    xs = [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)) for _ in range(3)]

    def mse(m, d):
        return torch.nn.functional.mse_loss(m(d[0]), d[1])

    model, _ = compare_training("mlp", model, reference, mse, xs, acc, clip=0.5)
    assert model.fc1.weight.to_local().shape == (16, 8) and model.fc2.weight.to_local().shape == (8, 16)
    check_checkpoint(acc, model, reference)
    print("TP_MLP_OK")


def check_checkpoint(acc, model, reference) -> None:
    """save_state writes the shards through DCP; load_state restores them; rank 0 keeps the full
    weights (get_state_dict gathers) for the single-process reader in the pytest test."""
    out = Path(sys.argv[1])
    full_sd = acc.get_state_dict(model)
    if dist.get_rank() == 0:
        assert_close(full_sd, dict(reference.state_dict()), "get_state_dict", 1e-4)
        torch.save(full_sd, out / "expected.pt")
    else:
        assert full_sd == {}
    acc.save_state(out / "ckpt")
    acc.save_model(model, out / "model")  # full weights, gathered, as safetensors
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    acc.load_state(out / "ckpt")
    assert_close(
        {n: full(p) for n, p in model.named_parameters()}, dict(reference.named_parameters()), "load", 1e-4
    )


def check_reshard_into_fsdp() -> None:
    """The TP checkpoint (fc1/fc2 sharded over tp) resumes on another mesh: FSDP2 over dp_shard=2,
    through accelerator.load_state; the weights are the TP run's, bit-exact, the optimizer its 3 steps."""
    out = Path(sys.argv[1])
    acc = Accelerator(
        parallelism_config=ParallelismConfig(dp_shard_size=2), fsdp_plugin=FullyShardedDataParallelPlugin()
    )
    torch.manual_seed(5)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(torch.zeros(12, 2), batch_size=4)
    model, opt, _ = acc.prepare(
        model, opt, loader
    )  # what the TP run prepared: a model, an optimizer, a loader
    assert next(model.parameters()).device_mesh.mesh_dim_names == ("dp_shard",)
    acc.load_state(out / "ckpt")
    params = {n: full(p) for n, p in model.named_parameters()}
    expected = torch.load(out / "expected.pt") if dist.get_rank() == 0 else params
    assert_close(params, expected, "TP checkpoint loaded into FSDP", 0.0)
    assert all(int(state["step"]) == 3 for state in opt.optimizer.state.values()), "optimizer state"
    print("TP_TO_FSDP_OK")


def check_llama() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    reference = copy.deepcopy(model)
    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    g = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, 64, (2, 12), generator=g) for _ in range(3)]

    def lm_loss(m, d):
        return m(input_ids=d, labels=d).loss

    with torch.no_grad():
        before = lm_loss(reference, ids[0]).item()
    model, _ = compare_training("llama", model, reference, lm_loss, ids, acc, clip=1.0)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(q, DTensor) and q.to_local().shape == (16, 32), q.to_local().shape
    with torch.no_grad():
        after = lm_loss(model, ids[0]).item()
    assert after < before, (before, after)  # it trains
    print(f"TP_LLAMA_OK loss on the first batch {before:.4f} -> {after:.4f}")

    # A model transformers already made tensor parallel (tp_plan="auto") on the accelerator's tp mesh
    # is prepared as it is: same DTensors, same logits as the reference.
    path = Path(sys.argv[1]) / "llama"
    if dist.get_rank() == 0:
        reference.save_pretrained(path)
    dist.barrier()
    loaded = LlamaForCausalLM.from_pretrained(path, tp_plan="auto", device_mesh=acc.torch_device_mesh["tp"])
    q = loaded.model.layers[0].self_attn.q_proj.weight
    assert isinstance(q, DTensor)
    loaded = acc.prepare(loaded)
    assert loaded.model.layers[0].self_attn.q_proj.weight is q
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids[0]).logits, reference(input_ids=ids[0]).logits, rtol=TOL, atol=TOL
        )
    print("TP_AUTO_OK")


def check_hsdp_and_ddp() -> None:
    def mse(model, step):
        x, y = batch(step)
        return torch.nn.functional.mse_loss(model(x), y)

    base = make_net(depth=2)
    ref_losses, ref_params = ddp_reference(base, mse, 3)
    for name, kwargs in (
        ("hsdp", {"fsdp_plugin": FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD")}),
        ("ddp", {}),
    ):
        sizes = {"dp_replicate_size": 1, "dp_shard_size": 2} if name == "hsdp" else {"dp_replicate_size": 2}
        acc = Accelerator(parallelism_config=ParallelismConfig(**sizes), **kwargs)
        assert (acc.data_parallel_size, acc.data_parallel_rank) == (2, dist.get_rank())
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt = acc.prepare(model, opt)
        losses = []
        for step in range(3):
            loss = mse(model, step)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=TOL, atol=1e-6)
        assert_close(full_params(acc.unwrap_model(model)), ref_params, name)
        if name == "hsdp":
            mesh = next(model.parameters()).device_mesh
            assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and tuple(mesh.shape) == (1, 2), mesh
        # two data-parallel ranks: each reads its own half
        loader = acc.prepare(torch.utils.data.DataLoader(torch.arange(8), batch_size=2))
        mine = torch.cat(list(loader)).tolist()
        seen = [None, None]
        dist.all_gather_object(seen, mine)
        assert sorted(seen[0] + seen[1]) == list(range(8)) and not set(seen[0]) & set(seen[1]), seen
    print("HSDP_DDP_OK")


class Attention(torch.nn.Module):
    """One self-attention block through F.scaled_dot_product_attention (what maybe_context_parallel shards)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def check_context_parallel() -> None:
    """cp_size=2 with FSDP2 over dp_shard_cp: each rank attends with its half of the sequence (torch's
    context_parallel; on CPU keys and values gathered by DTensor); the loss averaged over the cp ranks
    and every gradient equal the unsharded model's on the whole sequence; a causal attention is refused."""
    acc = Accelerator(
        parallelism_config=ParallelismConfig(cp_size=2), fsdp_plugin=FullyShardedDataParallelPlugin()
    )
    assert acc.torch_device_mesh["cp"].size() == 2 and acc.data_parallel_size == 1
    assert acc.context_parallel_rank == dist.get_rank()
    torch.manual_seed(0)
    model = Attention()
    reference = copy.deepcopy(model)
    model = acc.prepare(model)
    assert acc.torch_device_mesh["dp_shard_cp"].size() == 2
    assert next(model.parameters()).device_mesh.mesh_dim_names == ("dp_shard_cp",)  # FSDP shards over cp too
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 16, 16, generator=g), torch.randn(2, 16, 16, generator=g)
    ref_loss = torch.nn.functional.mse_loss(reference(x), y)
    ref_loss.backward()
    xs, ys = x.clone(), y.clone()
    with acc.maybe_context_parallel(buffers=[xs, ys], buffer_seq_dims=[1, 1], no_restore_buffers={xs, ys}):
        assert xs.shape == (2, 8, 16), xs.shape  # this rank's half of the sequence
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        acc.backward(loss)
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    torch.testing.assert_close(mean / 2, ref_loss.detach(), rtol=TOL, atol=TOL)
    grads = {n: full(p.grad) for n, p in model.named_parameters()}
    assert_close(grads, {n: p.grad for n, p in reference.named_parameters()}, "cp grads", TOL)
    xs = x.clone()
    try:
        with acc.maybe_context_parallel(buffers=[xs], buffer_seq_dims=[1]):
            model(xs, is_causal=True)
        raise AssertionError("a causal attention ran under context parallelism on CPU")
    except RuntimeError as err:
        assert "without a mask only" in str(err), err
    assert torch.equal(xs, x)  # restored when the block ends
    print("CP_OK")


def main() -> None:
    PartialState()
    check_mlp_and_data()
    check_reshard_into_fsdp()
    check_llama()
    check_hsdp_and_ddp()
    check_context_parallel()
    print("TP_MESH_OK")


if __name__ == "__main__":
    main()
