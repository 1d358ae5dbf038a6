"""2-rank checks of the core, in one launch: DDP parity, accumulation, collectives, control."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator, InitProcessGroupKwargs
from accelerando.state import PartialState, reset_runtime
from accelerando.utils import DistributedOperationException, gather_object


def model_fn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def data(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )


def reference(windows, x, y, lr=0.1):
    """Plain single-process training: one full-batch SGD step per window of global samples."""
    ref = model_fn()
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for lo, hi in windows:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    return ref


def check_ddp_equals_full_batch(acc):
    x, y = data(32)
    model = model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    # the group is held from Python by an attribute set after the reducer and logger, so freed after them
    order = list(vars(model))
    last_cpp_holder = max(order.index("reducer"), order.index("logger"))
    assert order.index("_accelerando_group_keeper") > last_cpp_holder, order
    assert model._accelerando_group_keeper.group is model.process_group
    r = acc.process_index
    for step in range(4):  # global batch of 8 = 4 per rank
        lo = step * 8 + r * 4
        acc.backward(torch.nn.functional.mse_loss(model(x[lo : lo + 4]), y[lo : lo + 4]))
        opt.step()
        opt.zero_grad()
    ref = reference([(s * 8, s * 8 + 8) for s in range(4)], x, y)
    for p, q in zip(acc.unwrap_model(model).parameters(), ref.parameters()):
        assert (p - q).abs().max().item() < 1e-10, (p - q).abs().max()


def check_local_sgd(acc):
    """LocalSGD(k=2) equals plain PyTorch: each rank steps alone; parameters averaged every 2 steps."""
    from accelerando.local_sgd import LocalSGD

    x, y = data(48)
    model = model_fn()
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    r = acc.process_index
    with LocalSGD(acc, model, local_sgd_steps=2) as local_sgd:
        for step in range(5):  # 2 averages inside, 1 more on leaving the context
            lo = step * 8 + r * 4
            acc.backward(torch.nn.functional.mse_loss(model(x[lo : lo + 4]), y[lo : lo + 4]))
            opt.step()
            opt.zero_grad()
            local_sgd.step()
    replicas = [model_fn() for _ in range(2)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in replicas]
    for step in range(5):
        for rank, (m, o) in enumerate(zip(replicas, opts)):
            lo = step * 8 + rank * 4
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x[lo : lo + 4]), y[lo : lo + 4]).backward()
            o.step()
        if step % 2 == 1 or step == 4:
            with torch.no_grad():
                for a, b in zip(*(m.parameters() for m in replicas)):
                    a.copy_((a + b) / 2)
                    b.copy_(a)
    for p, q in zip(acc.unwrap_model(model).parameters(), replicas[0].parameters()):
        assert (p - q).abs().max().item() < 1e-10, (p - q).abs().max()


def check_accumulation_with_partial_window():
    reset_runtime()
    acc = Accelerator(gradient_accumulation_steps=2)
    x, y = data(40)
    model = model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    # 5 global micro-batches of 8 (4 per rank, batch i of rank r is global batch 2i + r);
    # windows of 2, 2 and a partial 1.
    loader = acc.prepare(DataLoader(TensorDataset(x, y), batch_size=4))
    assert len(loader) == 5
    losses = []
    for xb, yb in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            losses.append(loss.detach())
            opt.step()
            opt.zero_grad()
    ref = reference([(0, 16), (16, 32), (32, 40)], x, y)
    for p, q in zip(acc.unwrap_model(model).parameters(), ref.parameters()):
        assert (p - q).abs().max().item() < 1e-10, (p - q).abs().max()
    # the local gradients differ between ranks inside a window (no_sync really skipped the all-reduce)
    return losses


def check_collectives(acc):
    r, w = acc.process_index, acc.num_processes
    g = acc.gather(torch.tensor([r, r]))
    assert g.tolist() == [0, 0, 1, 1], g
    nested = acc.gather({"a": torch.full((2, 3), float(r)), "b": [torch.tensor(r)]})
    assert nested["a"].shape == (4, 3) and nested["b"][0].tolist() == [0, 1]
    uneven = acc.gather(torch.arange(r + 2))  # 2 rows on rank 0, 3 on rank 1: padded and trimmed
    assert uneven.tolist() == [0, 1, 0, 1, 2], uneven
    try:
        acc.gather(torch.zeros(2, r + 1))
    except DistributedOperationException as err:  # Accelerate's name, and a ValueError
        assert isinstance(err, ValueError) and "due to shape mismatches" in str(err), err
        assert "rank 0: (2, 1), rank 1: (2, 2)" in str(err), err
    else:
        raise AssertionError("mismatched trailing shapes must raise")
    try:
        acc.gather([torch.zeros(1)] * (r + 1))
    except ValueError as err:
        assert "different numbers of tensors: [1, 2]" in str(err), err
    else:
        raise AssertionError("different structures must raise")
    assert acc.reduce(torch.tensor([r + 1.0]), "sum").item() == 3.0
    assert acc.reduce(torch.tensor([r + 1.0]), "mean").item() == 1.5
    assert acc.reduce(torch.tensor([r + 1.0]), "max", scale=2.0).item() == 4.0
    padded = acc.pad_across_processes(torch.ones(r + 1, 2), dim=0, pad_index=-1)
    assert padded.shape == (2, 2) and (r == 1 or padded[1].tolist() == [-1, -1])
    first = acc.pad_across_processes(torch.ones(r + 1), pad_first=True)
    assert r == 1 or first.tolist() == [0, 1]
    from accelerando.utils import broadcast, broadcast_object_list

    assert broadcast(torch.tensor([r * 10])).item() == 0
    assert broadcast_object_list([{"r": r}])[0] == {"r": 0}
    assert gather_object([f"s{r}"]) == ["s0", "s1"]
    assert gather_object({"r": r}) == [{"r": 0}, {"r": 1}]
    # metrics: objects and tensors, no dataloader -> everything
    assert acc.gather_for_metrics(["x"]) == ["x", "x"]
    assert w == 2


def check_control(acc):
    r = acc.process_index
    assert PartialState().num_processes == 2 and PartialState().backend == "gloo"
    assert str(acc.distributed_type) == "MULTI_CPU"
    with acc.split_between_processes(list(range(5)), apply_padding=True) as part:
        assert part == ([0, 1, 2] if r == 0 else [3, 4, 4]), part
    order = []
    with acc.main_process_first():
        order.append(r)
    if r == 1:
        acc.set_trigger()
    assert acc.check_trigger() is True
    assert acc.check_trigger() is False
    calls = []
    acc.on_last_process(lambda: calls.append(1))()
    assert calls == ([1] if r == 1 else [])
    acc.wait_for_everyone()


def check_join_uneven_inputs(acc):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    with acc.join_uneven_inputs([model]):
        for _ in range(3 + 2 * acc.process_index):  # 3 steps on rank 0, 5 on rank 1
            acc.backward(model(torch.ones(1, 2)).sum())
            opt.step()
            opt.zero_grad()


def check_trigger_sync_in_backward(acc):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x = torch.full((1, 2), float(acc.process_index + 1))
    with acc.no_sync(model):
        first = model(x).sum()
        second = model(x).sum()
        with acc.trigger_sync_in_backward(model):
            (first + second).backward()
    grads = acc.gather(model.module.weight.grad[None])
    assert torch.equal(grads[0], grads[1]), grads  # all-reduced although inside no_sync


def main():
    timeout = timedelta(seconds=77)
    acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)])
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    pg = dist.distributed_c10d._get_default_group()
    assert pg._get_backend(torch.device("cpu")).options._timeout == timeout
    check_trigger_sync_in_backward(acc)
    check_ddp_equals_full_batch(acc)
    check_collectives(acc)
    check_control(acc)
    check_join_uneven_inputs(acc)
    check_local_sgd(acc)
    check_accumulation_with_partial_window()
    PartialState().print("core checks passed")


if __name__ == "__main__":
    main()
