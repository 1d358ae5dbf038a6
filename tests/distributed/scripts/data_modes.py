"""2-rank data-loading checks in one launch; then saves loader states for data_resume.py.

Usage: torchrun --nproc_per_node=2 data_modes.py OUT_DIR
Every mode's per-rank batches are compared with a brute-force simulation, and the union of the
ranks' samples with the dataset (no duplicates, nothing missing, order as documented).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accelerando.config.options import DataLoaderConfiguration as Config
from accelerando.data import prepare_data_loader, skip_first_batches
from accelerando.data.samplers import SeedableRandomSampler


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class Nested(Dataset):
    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((2,), float(i)), "name": f"s{i}", "pair": (i, torch.tensor([i, -i]))}


class Mixed(Dataset):
    """Samples of every kind default_collate handles, one tensor field a transposed view."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict:
        return {
            "x": torch.full((3, 4), float(i)),
            "t": torch.arange(6, dtype=torch.bfloat16).view(2, 3).t() + i,  # a transposed view
            "scalar": torch.tensor(i),
            "n": np.full((2,), i, dtype=np.int16),
            "pair": (i, f"s{i}"),
            "ok": bool(i % 2),
        }


def same(a, b) -> bool:
    """Equal values, dtypes and container types, all the way down."""
    if isinstance(a, torch.Tensor):
        return type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class OddEven:
    """A custom batch sampler (uneven sizes) that prepare must keep."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for start in (0, 1):
            part = list(range(start, self.n, 2))
            for i in range(0, len(part), 3):
                yield part[i : i + 3]

    def __len__(self) -> int:
        return sum(-(-len(range(s, self.n, 2)) // 3) for s in (0, 1))


RANK, WORLD = 0, 1


def prep(dl: DataLoader, **cfg) -> DataLoader:
    return prepare_data_loader(
        dl, num_processes=WORLD, process_index=RANK, device=None, config=Config(**cfg), gradient_state=None
    )


def as_ids(batch) -> list[int]:
    if isinstance(batch, dict):
        return [int(v) for v in batch["x"][:, 0].tolist()]
    return [int(v) for v in batch.tolist()]


def drain(loader: DataLoader) -> list[list[int]]:
    """All batches of one pass, checking the bookkeeping the gradient state reads."""
    try:
        expected: int | None = len(loader)  # the length of the coming pass (a skip shortens it)
    except TypeError:  # an iterable dataset without a length
        assert isinstance(loader.dataset, IterableDataset)
        expected = None
    out, ends = [], []
    for batch in loader:
        out.append(as_ids(batch))
        assert loader.batches_yielded == len(out)
        ends.append(loader.end_of_dataloader)
        if expected is not None:
            assert len(loader) - loader.batches_yielded == expected - len(out)
    assert ends == [False] * (len(out) - 1) + [True] * bool(out), ends
    assert expected is None or len(out) == expected, (len(out), expected)
    return out


def everyone(obj) -> list:
    box = [None] * WORLD
    dist.all_gather_object(box, obj)
    return box


def reference(order: list[int], b: int, split: bool, even: bool, drop: bool) -> list[list[list[int]]]:
    """Brute force: cut torch-style batches, then deal / split them as documented."""
    n = WORLD
    batches = [order[i : i + b] for i in range(0, len(order), b)]
    if drop:
        batches = [x for x in batches if len(x) == b]
    cycle = itertools.cycle(order)
    out: list[list[list[int]]] = [[] for _ in range(n)]
    size, groups = (
        (b, [[x] for x in batches])
        if split
        else (n * b, [batches[i : i + n] for i in range(0, len(batches), n)])
    )
    for group in groups:
        flat = [i for x in group for i in x]
        if len(flat) < size:
            if drop:
                break
            if even:
                flat += [next(cycle) for _ in range(size - len(flat))]
        p = size // n
        for r in range(n):
            if flat[r * p : (r + 1) * p]:
                out[r].append(flat[r * p : (r + 1) * p])
    return out


def check_union(per_rank: list[list[list[int]]], order: list[int], even: bool, drop: bool) -> None:
    seen = [i for rank in per_rank for batch in rank for i in batch]
    if not even and not drop:
        assert sorted(seen) == sorted(order), "every sample exactly once"
    if even or drop:
        assert len({len(r) for r in per_rank}) == 1, "same number of steps on every rank"
    if drop:
        assert len(seen) == len(set(seen))


def check_map_style() -> None:
    for n, b, shuffle, split, even, drop in itertools.product((23, 3), (4,), *([(False, True)] * 4)):
        loader = prep(
            DataLoader(Indexed(n), batch_size=b, shuffle=shuffle, drop_last=drop),
            split_batches=split,
            even_batches=even,
        )
        got = everyone(drain(loader))
        seeds = everyone(loader.seed)
        assert seeds[0] == seeds[1] or not shuffle, "the shuffle seed is shared"
        order = list(SeedableRandomSampler(range(n), data_seed=seeds[0])) if shuffle else list(range(n))
        assert got == reference(order, b, split, even, drop), (n, shuffle, split, even, drop, got)
        check_union(got, order, even, drop)
        for dispatch_cfg in ({"dispatch_batches": True},):
            disp = prep(
                DataLoader(Indexed(n), batch_size=b, shuffle=shuffle, drop_last=drop),
                split_batches=split,
                even_batches=even,
                data_seed=seeds[0],
                **dispatch_cfg,
            )
            assert everyone(drain(disp)) == got, ("dispatch", n, shuffle, split, even, drop)
    for even in (False, True):
        loader = prep(DataLoader(Indexed(17), batch_sampler=OddEven(17)), even_batches=even)
        assert type(loader.batch_sampler.batch_sampler) is OddEven
        got = everyone(drain(loader))
        source = list(OddEven(17))
        deal = [source[r::2] for r in range(2)]
        if even and len(source) % 2:
            deal[1].append(source[0])
        assert got == deal, (even, got)
        disp = prep(
            DataLoader(Indexed(17), batch_sampler=OddEven(17)), even_batches=even, dispatch_batches=True
        )
        assert everyone(drain(disp)) == got


def check_iterable() -> None:
    for n, split, even, drop in itertools.product((22, 3), *([(False, True)] * 3)):
        kw = {"split_batches": split, "even_batches": even}
        local = prep(DataLoader(Stream(n), batch_size=4, drop_last=drop), dispatch_batches=False, **kw)
        got = everyone(drain(local))
        assert got == reference(list(range(n)), 4, split, even, drop), (n, split, even, drop, got)
        check_union(got, list(range(n)), even, drop)
        disp = prep(DataLoader(Stream(n), batch_size=4, drop_last=drop), **kw)  # dispatch is the default
        assert type(disp).__name__ == "DataLoaderDispatcher"
        assert everyone(drain(disp)) == got, ("dispatch", n, split, even, drop)


def check_nested_dispatch() -> None:
    loader = prep(DataLoader(Nested(), batch_size=3), dispatch_batches=True, even_batches=False)
    batches = list(loader)
    mine = [i for b in batches for i in as_ids(b)]
    for b in batches:
        ids = as_ids(b)
        assert b["name"] == [f"s{i}" for i in ids] and b["pair"][0].tolist() == ids
        assert b["pair"][1].tolist() == [[i, -i] for i in ids]
    assert sorted(sum(everyone(mine), [])) == list(range(11))


class Ragged(Dataset):
    """Sample i is i+1 copies of i: batches need padding to their longest sample."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((i + 1,), i)


def pad_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=-1)


def check_dispatch_batches_equal_local_ones() -> None:
    """Every kind of sample default_collate handles arrives on every rank exactly as the rank's
    own non-dispatch batch (values, dtypes, container types), in two passes."""
    for even in (True, False):
        disp = prep(DataLoader(Mixed(), batch_size=4, shuffle=True), dispatch_batches=True, even_batches=even)
        local = prep(DataLoader(Mixed(), batch_size=4, shuffle=True), even_batches=even)
        for _ in range(2):
            got, want = list(disp), list(local)
            assert len(got) == len(want) and all(same(a, b) for a, b in zip(got, want)), even


def check_dispatch_collates_like_accelerate() -> None:
    """Without split_batches each rank's batch is collated on its own (exactly the non-dispatch
    batch, padding included); with split_batches the step's batch is collated once, then sliced."""
    for split in (False, True):
        b = 8 if split else 4
        local = [
            t.tolist()
            for t in prep(DataLoader(Ragged(), batch_size=b, collate_fn=pad_collate), split_batches=split)
        ]
        disp = prep(
            DataLoader(Ragged(), batch_size=b, collate_fn=pad_collate),
            split_batches=split,
            dispatch_batches=True,
        )
        got = [t.tolist() for t in disp]
        if not split:
            assert got == local, (got, local)
        ranks = everyone(got)
        if split:  # one step, one padded width on every rank
            assert all(len(ranks[0][k][0]) == len(ranks[1][k][0]) for k in range(len(ranks[1])))
        assert sorted(max(row) for batches in ranks for t in batches for row in t) == list(range(16))


class CountingLoads(Indexed):
    loads = 0

    def __getitem__(self, i: int) -> int:
        CountingLoads.loads += 1
        return i


def check_dispatch_reads_no_batch_ahead() -> None:
    """With a known length rank 0 loads no round ahead of the step, receivers are told which batch
    is their last (end_of_dataloader, remainder on time), and a collective in every step, as in
    DDP training, never waits on a batch that rank 0 would send only after it; a custom batch
    sampler (length unknown: one round ahead on every rank) meets the same collective."""
    for split, even, sampler in itertools.product((False, True), (True, False), (None, "custom")):
        n = 25
        dl = (
            DataLoader(CountingLoads(n), batch_size=4, shuffle=True)
            if sampler is None
            else DataLoader(CountingLoads(n), batch_sampler=OddEven(n))
        )
        loader = prep(dl, dispatch_batches=True, split_batches=split and sampler is None, even_batches=even)
        steps = everyone(len(loader))
        CountingLoads.loads = 0
        held = []
        for k, _ in enumerate(loader):
            held.append((CountingLoads.loads, loader.end_of_dataloader, loader.remainder))
            if k < min(steps):  # every rank takes part in this step's collective
                dist.all_reduce(torch.ones(1))
        assert [h[1] for h in held] == [False] * (len(held) - 1) + [True], (split, even, sampler, held)
        assert everyone(held[-1][2]) == [held[-1][2]] * WORLD, (split, even, sampler, everyone(held))
        if RANK == 0 and sampler is None:
            per_round = 4 * (1 if split else WORLD)
            loads = [h[0] for h in held]
            assert loads[:-1] == [per_round * (k + 1) for k in range(len(held) - 1)], (split, even, loads)


def check_dispatch_pass_left_early() -> None:
    """A pass every rank leaves with `break` leaves nothing behind for the next pass, even when
    rank 0 went further than the others (its extra batches are dropped as stale)."""
    for split in (False, True):
        loader = prep(DataLoader(Indexed(200), batch_size=2), dispatch_batches=True, split_batches=split)
        whole = drain(loader)
        for stop in (0, 1, 7, 5 if RANK == 0 else 2):
            for k, _ in enumerate(loader):
                if k == stop:
                    break
            again = drain(loader)
            assert again == whole, (split, stop, again, whole)


def check_dispatch_with_workers() -> None:
    """Rank 0's batches come from worker processes (shared memory): ranks still get exactly the
    batches they would load themselves."""
    for split in (False, True):

        def loader(split: bool = split, **cfg):
            dl = DataLoader(Indexed(37), batch_size=4, shuffle=True, num_workers=1)
            return prep(dl, split_batches=split, data_seed=3, **cfg)

        assert drain(loader(dispatch_batches=True)) == drain(loader()), split


def check_dispatchers_share_the_default_group() -> None:
    """Dispatchers reuse the gloo default group: preparing them starts no threads (a group per
    loader would leave a gloo thread per loader ever prepared, waking 100 times a second)."""
    import os

    threads = len(os.listdir("/proc/self/task"))
    loaders = [prep(DataLoader(Indexed(9), batch_size=2), dispatch_batches=True) for _ in range(3)]
    assert all(d._channel.group is dist.group.WORLD for d in loaders)
    assert len({d._channel.tag for d in loaders}) == 3, "each channel has its own message tag"
    assert len(os.listdir("/proc/self/task")) == threads


def check_two_dispatchers_in_lockstep() -> None:
    """Two dispatchers sharing the group, iterated together, each get only their own messages."""
    a = prep(DataLoader(Indexed(23), batch_size=4), dispatch_batches=True, even_batches=False)
    b = prep(DataLoader(Indexed(23), batch_size=3, shuffle=True), dispatch_batches=True, even_batches=False)
    want_a = drain(prep(DataLoader(Indexed(23), batch_size=4), even_batches=False))
    want_b = drain(prep(DataLoader(Indexed(23), batch_size=3, shuffle=True), even_batches=False))
    got_a, got_b = [], []
    for x, y in itertools.zip_longest(a, b):
        if x is not None:
            got_a.append(as_ids(x))
        if y is not None:
            got_b.append(as_ids(y))
    assert (got_a, got_b) == (want_a, want_b)


def _system_lets_a_peer_read_memory() -> bool:
    """No Yama, or Yama's ptrace_scope 0: a process may read another of its user unasked."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip() == "0"
    except OSError:
        return True


def check_every_transport_route() -> None:
    """The same dispatch checks when rank 1 copies through the shared-memory ring, or receives over
    gloo (what a rank on another host does), as when it reads rank 0's memory (the default here
    where the system allows it)."""
    import accelerando.data.transport as transport_module
    from accelerando.utils import patch_environment

    def cross(**env: str) -> frozenset[int]:
        with patch_environment(**env):
            return prep(DataLoader(Indexed(4), batch_size=2), dispatch_batches=True)._channel.cross

    # Unset first: once rank 0 has opened itself (=1) the process stays open.
    unasked = {1} if _system_lets_a_peer_read_memory() else frozenset()
    assert cross() == unasked, "unset: cross-memory only where the system already allows it"
    assert cross(ACCELERANDO_DISPATCH_CROSS_MEMORY="1") == {1}, "cross-memory reads work on this machine"
    assert cross(ACCELERANDO_DISPATCH_CROSS_MEMORY="0") == frozenset()
    real = transport_module.local_route
    try:
        for name in ("ring", "gloo"):
            if name == "gloo":
                transport_module.local_route = lambda group, channel: None
            with patch_environment(ACCELERANDO_DISPATCH_CROSS_MEMORY="0"):
                check_nested_dispatch()
                check_dispatch_batches_equal_local_ones()
                check_dispatch_collates_like_accelerate()
                check_dispatch_reads_no_batch_ahead()
                check_dispatch_pass_left_early()
                check_two_dispatchers_in_lockstep()
                disp = prep(DataLoader(Stream(22), batch_size=4), split_batches=True)
                assert everyone(drain(disp)) == reference(list(range(22)), 4, True, True, False), name
    finally:
        transport_module.local_route = real


def check_rng_untouched_and_skip() -> None:
    torch.manual_seed(5)
    before = torch.get_rng_state()
    loader = prep(DataLoader(Indexed(40), batch_size=2, shuffle=True))
    full = drain(loader)
    assert torch.equal(before, torch.get_rng_state()), "iterating must not draw from the global RNG"
    loader.set_epoch(0)
    assert drain(skip_first_batches(loader, 3)) == full[3:]
    for dispatch in (False, True):
        it = prep(DataLoader(Stream(30), batch_size=2), dispatch_batches=dispatch)
        whole = drain(it)
        rest = drain(skip_first_batches(it, 4))
        assert rest == whole[4:], (dispatch, whole, rest)


def check_user_generator() -> None:
    """Shuffled with the user's generator, the order is drawn from it every epoch (rank 0's state
    shared at each pass start): 2 ranks see exactly the 1-process run's batches on the same
    generator, with or without split_batches or dispatch_batches (Accelerate's test_script)."""
    for split, dispatch in itertools.product((False, True), (False, True)):
        g = torch.Generator()
        dl = DataLoader(Indexed(24), batch_size=4 * (WORLD if split else 1), shuffle=True, generator=g)
        loader = prep(dl, split_batches=split, dispatch_batches=dispatch)
        g.manual_seed(100 + RANK)  # after prepare, as test_script does; rank 0's seed must win
        one = DataLoader(
            Indexed(24), batch_size=4 * WORLD, shuffle=True, generator=torch.Generator().manual_seed(100)
        )
        for epoch in range(3):
            ranks = everyone(drain(loader))
            steps = [sum((r[k] for r in ranks), []) for k in range(len(ranks[0]))]
            assert steps == [b.tolist() for b in one], (split, dispatch, epoch, steps)


class WholeBatches(IterableDataset):
    """Yields 5 ready-made batches of 4 (a DataLoader with batch_size=None)."""

    def __iter__(self):
        return (torch.arange(4 * k, 4 * k + 4) for k in range(5))

    def __len__(self) -> int:
        return 5


def check_whole_batches() -> None:
    """A dataset that makes its own batches, with or without dispatch_batches: each rank gets whole
    batches in rank order (a short last round completed from the first under even_batches), or,
    with split_batches, its piece of every batch."""
    whole = [list(range(4 * k, 4 * k + 4)) for k in range(5)]
    for split, even, dispatch in itertools.product((False, True), (True, False), (True, False)):
        loader = prep(
            DataLoader(WholeBatches(), batch_size=None),
            dispatch_batches=dispatch,
            split_batches=split,
            even_batches=even,
        )
        got = everyone(drain(loader))
        if split:
            want = [[b[2 * r : 2 * r + 2] for b in whole] for r in range(WORLD)]
        else:
            want = [whole[0::2], whole[1::2] + ([whole[0]] if even else [])]
        assert got == want, (split, even, dispatch, got)


def check_gather_for_metrics() -> None:
    from accelerando import Accelerator

    acc = Accelerator()
    for n, b in ((101, 8), (13, 4), (16, 4), (3, 4)):
        loader = acc.prepare(DataLoader(Indexed(n), batch_size=b))
        seen: list[int] = []
        for batch in loader:
            seen += acc.gather_for_metrics(batch).tolist()
        assert seen == list(range(n)), (n, seen)
        it = acc.prepare(DataLoader(Stream(n), batch_size=b))
        seen = []
        for batch in it:
            seen += acc.gather_for_metrics(batch).tolist()
        assert seen == list(range(n)), ("iterable", n, seen)
        for split in (False, True):  # map-style data through dispatch_batches
            disp = prepare_data_loader(
                DataLoader(Indexed(n), batch_size=b * (1 + split)),
                num_processes=WORLD,
                process_index=RANK,
                device=None,
                config=Config(dispatch_batches=True, split_batches=split),
                gradient_state=acc.gradient_state,
            )
            seen = []
            for batch in disp:
                seen += acc.gather_for_metrics(batch).tolist()
            assert seen == list(range(n)), ("dispatch", split, n, seen)
    # nested structures and plain objects: still exactly the dataset's 101 samples
    loader = acc.prepare(DataLoader(Indexed(101), batch_size=8))
    rows, objects = [], []
    for batch in loader:
        out = acc.gather_for_metrics({"x": batch, "pair": [batch * 2]})
        rows += out["x"].tolist()
        assert out["pair"][0].tolist() == [2 * v for v in out["x"].tolist()]
        objects += acc.gather_for_metrics([f"s{int(v)}" for v in batch])
    assert rows == list(range(101)) and objects == [f"s{i}" for i in range(101)], (len(rows), len(objects))


def lr_trace(acc, batches_per_rank: int, split: bool = False) -> list[float]:
    """LR after each micro-step; LambdaLR with factor max(0, 1 - t/10), base LR 1.0 (docs/scheduler.md)."""
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: max(0.0, 1 - t / 10))
    per_step = 2 * (WORLD if split else 1)  # with split_batches the batch size given is the global one
    loader = DataLoader(torch.ones(batches_per_rank * 2 * WORLD, 1), batch_size=per_step)
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    out = []
    for x in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum() * 0)
            opt.step()
            sched.step()
            opt.zero_grad()
        out.append(round(sched.get_last_lr()[0], 6))
    return out


def check_scheduler_semantics() -> None:
    """The 2-process tables of docs/scheduler.md (4 micro-batches per rank)."""
    import warnings

    from accelerando import Accelerator, DataLoaderConfiguration

    assert lr_trace(Accelerator(), 4) == [0.8, 0.6, 0.4, 0.2]
    assert lr_trace(Accelerator(gradient_accumulation_steps=2), 4) == [1.0, 0.8, 0.8, 0.6]
    split = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    assert lr_trace(split, 4, split=True) == [0.9, 0.8, 0.7, 0.6]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_call = Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
        assert lr_trace(per_call, 4) == [0.9, 0.8, 0.7, 0.6]


STATE_CASES = {
    "plain": ({}, 0),
    "split": ({"split_batches": True}, 0),
    "dispatch": ({"dispatch_batches": True}, 0),
    "workers": ({}, 2),
    "iterable_dispatch": ({}, -1),
    "generator": ({}, 0),  # shuffled by the user's generator (seeded differently in data_resume.py)
    "generator_dispatch": ({"dispatch_batches": True}, 0),
}


def make_state_loader(name: str, stateful: bool) -> DataLoader:
    cfg, workers = STATE_CASES[name]
    if workers < 0:
        dl = DataLoader(Stream(70), batch_size=2)
    else:
        gen = torch.Generator().manual_seed(torch.initial_seed() % 2**31) if "generator" in name else None
        dl = DataLoader(Indexed(70), batch_size=2, shuffle=True, num_workers=workers, generator=gen)
    return prep(dl, use_stateful_dataloader=stateful, **cfg)


def save_states(out: Path) -> None:
    for name, stateful in itertools.product(STATE_CASES, (False, True)):
        loader = make_state_loader(name, stateful)
        loader.set_epoch(1)
        it = iter(loader)
        for _ in range(7):
            next(it)
        state = loader.state_dict()
        assert state["batches"] == 7 and state["epoch"] == 1
        rest = [as_ids(b) for b in it]
        following = drain(loader)  # the next epoch: a resumed run must go on exactly as this one
        torch.save(
            {"state": state, "rest": rest, "next": following}, out / f"{name}_{int(stateful)}_rank{RANK}.pt"
        )


def main() -> None:
    global RANK, WORLD
    dist.init_process_group("gloo")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    out = Path(sys.argv[1])
    check_map_style()
    check_iterable()
    check_nested_dispatch()
    check_dispatch_batches_equal_local_ones()
    check_dispatch_collates_like_accelerate()
    check_dispatch_reads_no_batch_ahead()
    check_dispatch_pass_left_early()
    check_dispatchers_share_the_default_group()
    check_two_dispatchers_in_lockstep()
    check_every_transport_route()
    check_dispatch_with_workers()
    check_rng_untouched_and_skip()
    check_user_generator()
    check_whole_batches()
    save_states(out)
    check_gather_for_metrics()
    check_scheduler_semantics()
    dist.barrier()
    if RANK == 0:
        print("data modes passed")


if __name__ == "__main__":
    main()
