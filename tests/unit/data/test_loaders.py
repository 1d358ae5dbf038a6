"""Prepared loaders in one process: each rank's loader is built with its rank, the union is checked."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from accelerando.config.options import DataLoaderConfiguration as Config
from accelerando.data import sharding as sh
from accelerando.data.prepare import prepare_data_loader
from accelerando.data.samplers import SeedableRandomSampler


class Counting(Dataset):
    """Returns its index; counts loads so tests can prove skipped samples were never read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.loads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.loads += 1
        return i


class EvenOddBatches:
    """A custom batch sampler with uneven batch sizes: it must be kept, not replaced."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        evens, odds = list(range(0, self.n, 2)), list(range(1, self.n, 2))
        for part in (evens, odds):
            for i in range(0, len(part), 3):
                yield part[i : i + 3]

    def __len__(self) -> int:
        return -(-len(range(0, self.n, 2)) // 3) + -(-len(range(1, self.n, 2)) // 3)


def prepared(dl: DataLoader, rank: int, world: int = 2, **cfg) -> DataLoader:
    cfg.setdefault("data_seed", 7)
    return prepare_data_loader(
        dl, num_processes=world, process_index=rank, device=None, config=Config(**cfg), gradient_state=None
    )


def run(loader: DataLoader) -> list[tuple[list[int], bool, int, int]]:
    out = []
    for batch in loader:
        out.append((batch.tolist(), loader.end_of_dataloader, loader.remainder, loader.batches_yielded))
    return out


@pytest.mark.parametrize(
    "n,bs,shuffle,split,even,drop",
    [
        (n, bs, shuffle, split, even, drop)
        for n, bs in ((10, 2), (13, 4), (3, 4))
        for shuffle, split, even, drop in itertools.product((False, True), repeat=4)
    ],
)
def test_map_style_union_matches_sharding(n, bs, shuffle, split, even, drop) -> None:
    order = list(SeedableRandomSampler(range(n), data_seed=7)) if shuffle else list(range(n))
    expect = None
    for rank in range(2):
        dl = DataLoader(Counting(n), batch_size=bs, shuffle=shuffle, drop_last=drop)
        loader = prepared(dl, rank, split_batches=split, even_batches=even)
        spec = sh.ShardSpec(rank, 2, bs, split, even, drop)
        expect = list(sh.iter_rank_batches(order, spec))
        got = run(loader)
        assert [b for b, *_ in got] == expect
        assert len(loader) == len(expect)
        assert [e for _, e, _, _ in got] == [False] * (len(expect) - 1) + [True] * bool(expect)
        assert [y for *_, y in got] == list(range(1, len(expect) + 1))
        if got:
            assert got[-1][2] == sh.remainder(n, spec)
        assert loader.total_batch_size == spec.global_size
        assert loader.total_dataset_length == n


def test_custom_batch_sampler_is_kept_and_dealt_round_robin() -> None:
    ds = Counting(11)
    seen = []
    for rank in range(2):
        dl = DataLoader(ds, batch_sampler=EvenOddBatches(11))
        loader = prepared(dl, rank, even_batches=False)
        assert type(loader.batch_sampler.batch_sampler) is EvenOddBatches
        batches = [b.tolist() for b in loader]
        assert len(loader) == len(batches)
        seen += [i for b in batches for i in b]
    assert sorted(seen) == list(range(11))


def test_custom_sampler_collate_and_options_preserved() -> None:
    def collate(items):
        return torch.tensor(items) * 10

    sampler = SequentialSampler(range(8))
    dl = DataLoader(
        Counting(8), batch_size=2, sampler=sampler, collate_fn=collate, pin_memory=False, drop_last=True
    )
    loader = prepared(dl, 1)
    assert loader.batch_sampler.batch_sampler.sampler is sampler
    assert loader.collate_fn is collate
    assert [b.tolist() for b in loader] == [[20, 30], [60, 70]]


def test_batch_sampler_passed_as_sampler() -> None:
    dl = DataLoader(Counting(6), sampler=BatchSampler(SequentialSampler(range(6)), 2, False), batch_size=None)
    assert list(prepared(dl, 0)) == [[0, 1], [4, 5]]  # the dataset receives the list of indices


def test_bad_input_names_the_value() -> None:
    dl = DataLoader(Counting(8), batch_size=3)
    with pytest.raises(
        ValueError, match=r"batch size \(3\) needs to be a round multiple of the number of processes \(2\)"
    ):
        prepared(dl, 0, split_batches=True)
    with pytest.raises(ValueError, match="process_index=2"):
        prepared(dl, 2)
    with pytest.raises(TypeError, match="DataLoader"):
        prepared([1, 2], 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size=None"):
        prepared(DataLoader(Counting(4), batch_size=None), 0)


def test_shuffle_never_draws_from_global_rng_and_set_epoch_reshuffles() -> None:
    dl = DataLoader(Counting(32), batch_size=4, shuffle=True)
    loader = prepared(dl, 0, world=1)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = [b.tolist() for b in loader]
    assert torch.equal(state, torch.get_rng_state())
    second = [b.tolist() for b in loader]  # epoch advanced by itself
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(32))
    loader.set_epoch(0)
    assert [b.tolist() for b in loader] == first
    loader.set_epoch(1)
    assert [b.tolist() for b in loader] == second


@pytest.mark.parametrize(
    "n, num_samples, replacement",
    [(10, None, False), (10, 25, False), (10, 30, False), (10, 4, False), (10, None, True), (10, 70, True)],
)
def test_seedable_order_is_torch_random_sampler_at_seed_plus_epoch(n, num_samples, replacement) -> None:
    """The order Accelerate's sampler of the same name gives: torch's, from a generator at seed + epoch."""
    ours = SeedableRandomSampler(range(n), data_seed=7, num_samples=num_samples, replacement=replacement)
    for epoch in (0, 3):
        ours.set_epoch(epoch)
        gen = torch.Generator().manual_seed(7 + epoch)
        reference = RandomSampler(range(n), num_samples=num_samples, replacement=replacement, generator=gen)
        assert list(ours) == list(reference)


def test_seed_follows_set_seed_without_data_seed() -> None:
    def order() -> list[list[int]]:
        dl = DataLoader(Counting(16), batch_size=4, shuffle=True)
        loader = prepare_data_loader(
            dl, num_processes=1, process_index=0, device=None, config=Config(), gradient_state=None
        )
        return [b.tolist() for b in loader]

    torch.manual_seed(3)
    a = order()
    torch.manual_seed(3)
    assert order() == a
    torch.manual_seed(4)
    assert order() != a


class Noisy(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return torch.tensor([torch.rand(()).item(), float(info.id if info else -1)])


def test_augmentation_randomness_differs_per_rank_and_worker_and_global_rng_untouched() -> None:
    torch.manual_seed(0)
    state = torch.get_rng_state()
    draws = {}
    for rank in range(2):
        loader = prepared(DataLoader(Noisy(), batch_size=2, num_workers=2), rank)
        for batch in loader:
            for value, worker in batch.tolist():
                draws[(rank, int(worker), value)] = True
    assert torch.equal(state, torch.get_rng_state())
    values = [v for (_, _, v) in draws]
    assert len(set(values)) == len(values) == 8
    assert {(r, w) for (r, w, _) in draws} == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_plain_state_dict_resumes_exactly_and_skip_never_loads() -> None:
    ds = Counting(40)
    full = [b.tolist() for b in prepared(DataLoader(ds, batch_size=2, shuffle=True), 1)]
    loader = prepared(DataLoader(ds, batch_size=2, shuffle=True), 1)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    assert state["batches"] == 3 and state["epoch"] == 0
    torch.manual_seed(123)  # a "new process" with another seed: the saved seed wins
    resumed = prepared(DataLoader(ds, batch_size=2, shuffle=True), 1, data_seed=None)
    resumed.load_state_dict(state)
    assert len(resumed) == len(full) - 3
    ds.loads = 0
    tail = [b.tolist() for b in resumed]
    assert head + tail == full
    assert ds.loads == 2 * len(tail), "skipped samples must not be loaded"
    assert len(resumed) == len(full) and resumed.state_dict()["epoch"] == 1


def test_skip_first_batches_prepared_and_plain() -> None:
    from accelerando.data.skip import skip_first_batches

    ds = Counting(30)
    loader = prepared(DataLoader(ds, batch_size=3), 0)
    full = [b.tolist() for b in loader]
    loader.set_epoch(0)
    view = skip_first_batches(loader, 2)
    assert len(view) == len(full) - 2
    ds.loads = 0
    assert [b.tolist() for b in view] == full[2:]
    assert ds.loads == 3 * (len(full) - 2)
    assert view.epoch == loader.epoch == 1, "the view shares the epoch counter"
    it = iter(skip_first_batches(loader, 1))
    next(it)
    assert loader.state_dict()["batches"] == 2 and loader.state_dict()["epoch"] == 1, (
        "the view owns the position"
    )
    assert len(view) == len(full), "only the first pass is shortened"
    plain = DataLoader(ds, batch_size=4)
    ds.loads = 0
    skipped = skip_first_batches(plain, 5)
    assert len(skipped) == 3 and [b.tolist() for b in skipped] == [
        [20, 21, 22, 23],
        [24, 25, 26, 27],
        [28, 29],
    ]
    assert ds.loads == 10
    with pytest.raises(ValueError, match="num_batches=-1"):
        skip_first_batches(plain, -1)


def test_gradient_state_sees_end_of_dataloader() -> None:
    from accelerando.state import GradientState, PartialState

    PartialState()
    gs = GradientState()
    loader = prepare_data_loader(
        DataLoader(Counting(5), batch_size=2),
        num_processes=2,
        process_index=1,
        device=None,
        config=Config(),
        gradient_state=gs,
    )
    seen = []
    for _ in loader:
        seen.append(
            (gs.in_dataloader, gs.end_of_dataloader, gs.remainder, len(loader) - loader.batches_yielded)
        )
    assert seen == [(True, False, 1, 1), (True, True, 1, 0)]
    assert not gs.in_dataloader


def loads_while_held(loader: DataLoader, ds: Counting) -> list[tuple[int, bool]]:
    """(samples loaded so far, end_of_dataloader) while the user holds each batch."""
    ds.loads = 0
    return [(ds.loads, loader.end_of_dataloader) for _ in loader]


@pytest.mark.parametrize("split", [False, True])
def test_known_length_loads_no_batch_ahead(split: bool) -> None:
    """A default (or seedable) sampler's pass has a known length: while the user holds batch k,
    only batches 1..k were loaded, and the last is still flagged as it is yielded."""
    from accelerando.data.skip import skip_first_batches

    ds = Counting(21)
    for shuffle, even, drop in itertools.product((False, True), repeat=3):
        dl = DataLoader(ds, batch_size=4, shuffle=shuffle, drop_last=drop)
        loader = prepared(dl, 0, split_batches=split, even_batches=even)
        sizes = [len(b) for b in loader]
        for view, held in ((loader, sizes), (skip_first_batches(loader, 2), sizes[2:])):
            seen = loads_while_held(view, ds)
            want = [(sum(held[: k + 1]), k == len(held) - 1) for k in range(len(held))]
            assert seen == want, (shuffle, even, drop)
    # a custom batch sampler's length is only its word: the loader still reads one batch ahead
    loader = prepared(DataLoader(ds, batch_sampler=EvenOddBatches(21)), 0)
    sizes = [len(b) for b in loader]
    seen = loads_while_held(loader, ds)
    assert [s[0] for s in seen] == [sum(sizes[: k + 2]) for k in range(len(sizes))]
    assert [s[1] for s in seen] == [False] * (len(seen) - 1) + [True]


def test_even_batches_attribute_takes_effect_next_pass() -> None:
    loader = prepared(DataLoader(Counting(5), batch_size=2), 1)
    assert len(loader) == 2
    loader.even_batches = False
    assert len(loader) == 1 and [b.tolist() for b in loader] == [[2, 3]]


def test_stateful_loader_in_process_roundtrip() -> None:
    ds = Counting(24)
    make = lambda: prepared(DataLoader(ds, batch_size=2, shuffle=True), 0, use_stateful_dataloader=True)  # noqa: E731
    full = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    other = make()
    other.load_state_dict(state)
    assert head + [b.tolist() for b in other] == full


@pytest.mark.parametrize("stateful", [False, True])
def test_a_pass_with_workers_leaves_no_feeder_thread_behind(stateful: bool) -> None:
    """When a pass ends (whole, or left by `break`), the threads that fed its workers their indices
    have exited. Before, the stateful loader's feeder thread was still alive after a `break`."""
    import threading

    def feeders() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "QueueFeederThread" and t.is_alive()]

    base = DataLoader(list(range(40)), batch_size=4, num_workers=2)
    dl = prepare_data_loader(base, put_on_device=False, use_stateful_dataloader=stateful)
    for _ in range(3):
        assert len(list(dl)) == 10
        assert feeders() == []
        for i, _batch in enumerate(dl):
            if i == 1:
                break
        assert feeders() == []
    first, second = iter(dl), iter(dl)  # ending one pass ends its own workers, not another's
    next(first), next(second)
    del first
    assert len(list(second)) == 9
