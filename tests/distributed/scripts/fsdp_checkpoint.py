"""FSDP2 checkpoints and loading. Phases (argv[2]): save1 / load2 run as one plain process (no
process group); main runs on 2 ranks: RAM-efficient loading, 1->2 reshard, sharded and full round
trips, save_model and get_state_dict."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_common import assert_close, make_net  # noqa: E402

from accelerando import Accelerator  # noqa: E402
from accelerando.config.fsdp import FullyShardedDataParallelPlugin  # noqa: E402

WORK = Path(sys.argv[1])


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def setup(plugin=None, depth=3, lr=1e-2):
    acc = Accelerator(fsdp_plugin=plugin or FullyShardedDataParallelPlugin())
    model = make_net(depth=depth)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def train(acc, model, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed + rank())
    for _ in range(steps):
        x = torch.randn(4, 16, generator=g)
        acc.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()


def snapshot(acc, model, opt):
    """Full model and optimizer state (rank 0 holds it; others {}), through the strategy's hooks."""
    import copy

    return copy.deepcopy(
        {
            "model": acc.strategy.model_state_dict(model, full=True),
            "optim": acc.strategy.optimizer_state_dict(model, opt.optimizer, full=True),
        }
    )  # on CPU, scalar optimizer state (step) aliases the live tensor


def check_snapshot(got, want, what):
    if rank() != 0:
        assert got["model"] == {} and got["optim"] == {}, f"{what}: rank {rank()} got a full copy"
        return
    assert_close(got["model"], want["model"], f"{what} model", tol=1e-6)
    for fqn, state in want["optim"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(got["optim"]["state"][fqn][key], value, msg=f"{what} {fqn}.{key}")


def phase_save1() -> None:
    acc, model, opt = setup()
    train(acc, model, opt, 2)
    acc.save_state(str(WORK / "ckpt1"))
    torch.save(snapshot(acc, model, opt), WORK / "ref1.pt")


def phase_load2() -> None:
    acc, model, opt = setup()
    acc.load_state(str(WORK / "ckpt2"))  # saved by 2 ranks, read by 1
    check_snapshot(snapshot(acc, model, opt), torch.load(WORK / "ref2.pt"), "2->1")
    print("LOAD2_OK")


def check_ram_efficient_loading() -> None:
    """Rank 0 builds the real model, rank 1 on meta; rank 1's peak memory grows by about its shard."""
    plugin = FullyShardedDataParallelPlugin(
        cpu_ram_efficient_loading=True, auto_wrap_policy="size_based_wrap", min_num_params=1
    )
    acc = Accelerator(fsdp_plugin=plugin)
    acc.prepare(make_net(depth=1))  # warm-up: lazy imports and the device mesh stay out of the window
    torch.manual_seed(3)
    layers = 32
    full_mib = layers * (1024 * 1024 + 1024) * 4 / 2**20
    with torch.device("cpu" if rank() == 0 else "meta"):
        model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(layers)))
    reference = {k: v.clone() for k, v in model.state_dict().items()} if rank() == 0 else {}
    before = peak_mib()
    model = acc.prepare(model)
    grown = peak_mib() - before
    full = acc.get_state_dict(model)
    if rank() == 0:
        assert_close(full, reference, "ram-efficient weights", tol=0)
    else:
        assert full == {}
        assert grown < 0.7 * full_mib, f"rank 1 peak grew {grown:.0f} MiB for a {full_mib:.0f} MiB model"
    print(f"rank {rank()} peak growth {grown:.0f} MiB, model {full_mib:.0f} MiB")
    del model, full, reference
    acc.free_memory()


def check_from_pretrained() -> None:
    """A from_pretrained model goes through RAM-efficient loading: every rank ends with rank 0's weights.

    (transformers 4.x builds on meta off rank 0 when the plugin exports FSDP_CPU_RAM_EFFICIENT_LOADING;
    5.x memory-maps the safetensors on every rank instead. Both paths are handled.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True))
    if rank() == 0:
        config = LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(WORK / "llama")
    dist.barrier()
    model = LlamaForCausalLM.from_pretrained(WORK / "llama")
    if rank() == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0)  # whatever rank 1 holds, it must end up with rank 0's weights
    model = acc.prepare(model)
    ids = torch.arange(12).reshape(1, 12)
    logits = model(input_ids=ids).logits.detach()
    gathered = [torch.empty_like(logits) for _ in range(2)]
    dist.all_gather(gathered, logits)
    torch.testing.assert_close(gathered[0], gathered[1])
    if rank() == 0:
        from safetensors.torch import load_file

        assert_close(acc.get_state_dict(model), load_file(str(WORK / "llama" / "model.safetensors")), "hf")
    else:
        acc.get_state_dict(model)
    acc.free_memory()


def phase_main() -> None:
    check_ram_efficient_loading()
    check_from_pretrained()
    # 1 -> 2: a checkpoint written by one unsharded process loads into 2 ranks' shards.
    acc, model, opt = setup()
    acc.load_state(str(WORK / "ckpt1"))
    ref1 = torch.load(WORK / "ref1.pt") if rank() == 0 else None
    check_snapshot(snapshot(acc, model, opt), ref1, "1->2")
    assert isinstance(
        acc.strategy.model_state_dict(model, full=False)["inp.weight"], torch.distributed.tensor.DTensor
    )
    # Sharded round trip: every rank writes its own file.
    train(acc, model, opt, 2, seed=5)
    acc.save_state(str(WORK / "ckpt2"))
    ref2 = snapshot(acc, model, opt)
    files = sorted(p.name for p in (WORK / "ckpt2" / "pytorch_model_fsdp_0").iterdir())
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(files), files
    if rank() == 0:
        torch.save(ref2, WORK / "ref2.pt")
    # The same state saved asynchronously (DCP's stager + dcp.save in the background): training
    # goes on meanwhile; the shards equal the synchronous ones and load back to the same state.
    acc.save_state(str(WORK / "ckpt2a"), async_save=True)
    train(acc, model, opt, 1, seed=9)
    acc.load_state(str(WORK / "ckpt2a"))  # waits for the background save
    check_snapshot(snapshot(acc, model, opt), ref2, "asynchronous sharded round trip")
    if rank() == 0:
        import json

        sums = [json.loads((WORK / c / "manifest.json").read_text())["files"] for c in ("ckpt2", "ckpt2a")]
        shards = [{k: v for k, v in s.items() if k.endswith(".distcp")} for s in sums]
        assert shards[0] and shards[0] == shards[1], shards
    train(acc, model, opt, 1, seed=9)
    acc.load_state(str(WORK / "ckpt2"))
    check_snapshot(snapshot(acc, model, opt), ref2, "sharded round trip")
    # Training continues identically after a load.
    train(acc, model, opt, 1, seed=11)
    after = snapshot(acc, model, opt)
    acc.load_state(str(WORK / "ckpt2"))
    train(acc, model, opt, 1, seed=11)
    now = snapshot(acc, model, opt)
    check_snapshot(now, after, "resume")
    # save_model / get_state_dict gather a full copy on rank 0 only.
    acc.save_model(model, str(WORK / "saved_model"))
    if rank() == 0:
        from safetensors.torch import load_file

        assert_close(load_file(str(WORK / "saved_model" / "model.safetensors")), now["model"], "save_model")
    check_full_state_dict()
    check_refusals()
    dist.barrier()
    print("FSDP_CHECKPOINT_OK")


def check_full_state_dict() -> None:
    """FULL_STATE_DICT: save_state writes rank 0's gathered copy; the load hooks broadcast it back."""
    plugin = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    acc, model, opt = setup(plugin)
    assert acc.strategy.state_io().name == "full"  # not sharded
    train(acc, model, opt, 2, seed=21)
    acc.save_state(str(WORK / "ckpt_full"))
    want = snapshot(acc, model, opt)
    if rank() == 0:
        from safetensors.torch import load_file

        assert_close(load_file(str(WORK / "ckpt_full" / "model.safetensors")), want["model"], "full file")
    train(acc, model, opt, 1, seed=22)
    acc.load_state(str(WORK / "ckpt_full"))
    check_snapshot(snapshot(acc, model, opt), want, "full round trip")
    # The hooks alone: rank 0's copy is broadcast into the shards; the caller's dicts stay as given.
    train(acc, model, opt, 1, seed=23)
    given = want["model"] if rank() == 0 else {}
    acc.strategy.load_model_state_dict(model, given, full=True)
    acc.strategy.load_optimizer_state_dict(
        model, opt.optimizer, want["optim"] if rank() == 0 else {}, full=True
    )
    assert all(not isinstance(v, torch.distributed.tensor.DTensor) for v in given.values())
    check_snapshot(snapshot(acc, model, opt), want, "full round trip")


def check_refusals() -> None:
    """A FULL_STATE_DICT checkpoint offered to a sharded run is refused on every rank, nothing loaded."""
    from accelerando.checkpoint.atomic import CheckpointError

    acc, model, opt = setup()
    before = snapshot(acc, model, opt)
    try:
        acc.load_state(str(WORK / "ckpt_full"))
    except CheckpointError as err:
        assert "sharded" in str(err) or "full" in str(err), err
    else:
        raise AssertionError("a full checkpoint was loaded into a sharded run")
    check_snapshot(snapshot(acc, model, opt), before, "after refusal")


if __name__ == "__main__":
    {"save1": phase_save1, "load2": phase_load2, "main": phase_main}[sys.argv[2]]()
