"""Prepared loaders against the real Accelerate, where the behaviour is pure (one process).

The 2-rank side of the user-generator order is in tests/distributed/scripts/data_modes.py
(`check_user_generator`, and the "generator" resume cases of data_resume.py).
"""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from accelerando.config.options import DataLoaderConfiguration as Config
from accelerando.data import prepare_data_loader, skip_first_batches

theirs = pytest.importorskip("accelerate.data_loader")

DATA = list(range(22))


def ours(dl: DataLoader, **cfg) -> DataLoader:
    return prepare_data_loader(dl, num_processes=1, process_index=0, config=Config(**cfg))


def their(dl: DataLoader, **kw) -> DataLoader:
    kw.setdefault("put_on_device", False)
    return theirs.prepare_data_loader(dl, num_processes=1, process_index=0, **kw)


def epochs(loader, n: int = 3) -> list[list[list[int]]]:
    return [[b.tolist() for b in loader] for _ in range(n)]


def shuffled(g: torch.Generator, how: str) -> DataLoader:
    if how == "shuffle":
        return DataLoader(DATA, batch_size=4, shuffle=True, generator=g)
    return DataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))


# ---- the user's generator decides the order (issue 19) ------------------------------------------
@pytest.mark.parametrize("how", ["shuffle", "sampler"])
def test_the_order_is_drawn_from_the_users_generator_in_every_epoch_as_accelerate(how: str) -> None:
    results = []
    for prepare in (ours, their, lambda dl: dl):  # ours, Accelerate's, a plain DataLoader
        g = torch.Generator()
        loader = prepare(shuffled(g, how))
        g.manual_seed(42)  # after prepare: the loader must read the generator object, not a copy
        results.append(epochs(loader))
    assert results[0] == results[1] == results[2]
    assert results[0][0] != results[0][1]  # the epochs do differ


def test_seedable_sampler_or_a_data_seed_keep_seed_and_epoch_orders() -> None:
    g = torch.Generator().manual_seed(42)
    before = g.get_state()
    for cfg in ({"use_seedable_sampler": True}, {"data_seed": 3}):
        loader = ours(shuffled(g, "shuffle"), **cfg)
        again = ours(shuffled(torch.Generator().manual_seed(7), "shuffle"), **{**cfg, "data_seed": 42})
        assert epochs(loader, 2) and torch.equal(g.get_state(), before)  # the generator is not drawn from
        assert again.seed == 42


def _state_roundtrip(state: dict) -> dict:
    """As a checkpoint stores it: torch.save, loaded weights-only."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("stateful", [False, True])
def test_resume_mid_epoch_gives_the_uninterrupted_runs_batches_in_this_and_later_epochs(
    stateful: bool,
) -> None:
    def make(seed: int) -> DataLoader:
        dl = shuffled(torch.Generator().manual_seed(seed), "shuffle")
        return ours(dl, use_stateful_dataloader=stateful)

    whole = make(5)
    first = [b.tolist() for b in whole]
    it = iter(whole)
    head = [next(it).tolist() for _ in range(2)]
    state = _state_roundtrip(whole.state_dict())
    rest = [b.tolist() for b in it]
    later = epochs(whole, 2)
    resumed = make(99)  # another seed: only the saved state can give the order back
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest and epochs(resumed, 2) == later
    assert head + rest != first  # epoch 1's order is not epoch 0's


def test_resume_between_epochs_and_through_skip_first_batches() -> None:
    a = ours(shuffled(torch.Generator().manual_seed(5), "shuffle"))
    epochs(a, 1)
    state = a.state_dict()
    want = epochs(a, 2)
    b = ours(shuffled(torch.Generator().manual_seed(6), "shuffle"))
    b.load_state_dict(state)
    assert epochs(b, 2) == want
    c = ours(shuffled(torch.Generator().manual_seed(6), "shuffle"))
    c.load_state_dict(state)
    assert [x.tolist() for x in skip_first_batches(c, 3)] == want[0][3:]


def test_a_state_without_the_generator_warns_that_the_order_is_not_restored() -> None:
    plain = ours(DataLoader(DATA, batch_size=4, shuffle=True))  # (seed, epoch): no generator saved
    loader = ours(shuffled(torch.Generator().manual_seed(1), "shuffle"))
    with pytest.warns(UserWarning, match="generator"):
        loader.load_state_dict(plain.state_dict())


# ---- set_epoch reaches a custom batch sampler and its sampler -----------------------------------
class EpochBatchSampler(BatchSampler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class EpochSampler(SequentialSampler):
    def __init__(self, data) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class EpochData(list):
    def __init__(self, data) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_set_epoch_reaches_a_custom_batch_sampler_its_sampler_and_the_dataset_as_accelerate() -> None:
    seen = []
    for prepare in (ours, their):
        data = EpochData(DATA)
        bs = EpochBatchSampler(EpochSampler(data), 4, False)
        loader = prepare(DataLoader(data, batch_sampler=bs))
        loader.set_epoch(3)
        now = (list(bs.epochs), list(bs.sampler.epochs), list(data.epochs))
        list(loader)
        seen.append((now, bs.epochs, bs.sampler.epochs, data.epochs))
    assert seen[0] == seen[1]
    assert seen[0][0] == ([3], [3], [3])


# ---- messages ------------------------------------------------------------------------------------
def test_split_batches_message_starts_with_accelerates_wording() -> None:
    with pytest.raises(ValueError) as ours_err:
        prepare_data_loader(
            DataLoader(DATA, batch_size=3), num_processes=2, process_index=0, split_batches=True
        )
    with pytest.raises(ValueError) as their_err:
        theirs.prepare_data_loader(
            DataLoader(DATA, batch_size=3), num_processes=2, process_index=0, split_batches=True
        )
    assert str(ours_err.value).startswith(str(their_err.value))
    assert "round multiple" in str(ours_err.value) and "split_batches=False" in str(ours_err.value)


# ---- DataLoaderShard / DataLoaderDispatcher built like a DataLoader ------------------------------
def _direct(module, name: str, stateful: bool = False):
    cls = getattr(module, name)
    if name == "DataLoaderShard":
        return cls(DATA, None, batch_size=4, skip_batches=2, use_stateful_dataloader=stateful)
    return cls(DATA, False, 1, stateful, batch_size=4)  # Accelerate's positional order


@pytest.mark.parametrize("name", ["DataLoaderShard", "DataLoaderDispatcher"])
@pytest.mark.parametrize("stateful", [False, True])
def test_loaders_built_like_a_dataloader_iterate_as_accelerates(name: str, stateful: bool) -> None:
    import accelerando.data as mine

    ours_dl, their_dl = _direct(mine, name, stateful), _direct(theirs, name, stateful)
    assert isinstance(ours_dl, DataLoader) and ours_dl.use_stateful_dataloader is stateful
    flags = []
    got = []
    for batch in ours_dl:
        got.append(batch.tolist())
        flags.append(ours_dl.end_of_dataloader)
    assert got == [b.tolist() for b in their_dl]
    assert flags == [False] * (len(got) - 1) + [True]
    # (Accelerate's dispatcher reads these from a dataset shard it was not given here)
    assert ours_dl.total_batch_size == 4 and ours_dl.total_dataset_length == len(DATA)
    if name == "DataLoaderShard":
        assert their_dl.total_batch_size == 4 and their_dl.total_dataset_length == len(DATA)
    assert [b.tolist() for b in ours_dl] == [b.tolist() for b in their_dl]  # each pass skips again


def test_a_directly_built_shard_keeps_device_iteration_and_the_users_generator() -> None:
    import accelerando.data as mine

    results = []
    for module in (mine, theirs):
        g = torch.Generator()
        rng = ["generator"] if module is mine else None  # theirs would need an AcceleratorState
        loader = module.DataLoaderShard(
            DATA, torch.device("cpu"), rng, g, batch_size=4, shuffle=True, generator=g, iteration=2
        )
        g.manual_seed(3)
        results.append(epochs(loader, 2))
        assert loader.iteration == 4 and loader.device == torch.device("cpu")
    assert results[0] == results[1]


def test_a_directly_built_loader_checks_its_arguments_like_a_dataloader() -> None:
    import accelerando.data as mine

    with pytest.raises(ValueError, match="batch_sampler"):
        mine.DataLoaderShard(DATA, batch_size=4, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="skip_batches=-1"):
        mine.DataLoaderShard(DATA, batch_size=4, skip_batches=-1)


# ---- dispatch_batches=True on a dataset that yields whole batches --------------------------------
class WholeBatches(torch.utils.data.IterableDataset):
    def __iter__(self):
        return ({"x": torch.arange(4 * k, 4 * k + 4)} for k in range(5))

    def __len__(self) -> int:
        return 5


def test_dispatching_a_dataset_of_whole_batches_works_as_accelerate() -> None:
    got = prepare_data_loader(
        DataLoader(WholeBatches(), batch_size=None), num_processes=1, process_index=0, dispatch_batches=True
    )
    want = their(DataLoader(WholeBatches(), batch_size=None), dispatch_batches=True, put_on_device=True)
    assert [b["x"].tolist() for b in got] == [b["x"].tolist() for b in want]
    assert len(got) == len(want) == 5 and got.end_of_dataloader
    split = ours(DataLoader(WholeBatches(), batch_size=None), dispatch_batches=True, split_batches=True)
    assert [b["x"].tolist() for b in split] == [list(range(4 * k, 4 * k + 4)) for k in range(5)]


def test_whole_batches_without_dispatch_on_one_process_are_the_datasets_as_accelerate() -> None:
    got = ours(DataLoader(WholeBatches(), batch_size=None), dispatch_batches=False)
    want = their(DataLoader(WholeBatches(), batch_size=None), dispatch_batches=False)
    assert [b["x"].tolist() for b in got] == [b["x"].tolist() for b in want]
    assert len(got) == 5 and got.total_batch_size is None


def test_save_state_and_load_state_restore_the_generator_order(tmp_path) -> None:
    from accelerando import Accelerator

    acc = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(11)
    loader = acc.prepare(shuffled(g, "shuffle"))
    epochs(loader, 1)
    it = iter(loader)
    next(it)
    acc.save_state(str(tmp_path / "ckpt"))
    rest, later = [b.tolist() for b in it], epochs(loader, 1)
    g.manual_seed(12345)  # whatever happened since, the checkpoint decides
    epochs(loader, 1)
    acc.load_state(str(tmp_path / "ckpt"))
    assert [b.tolist() for b in loader] == rest and epochs(loader, 1) == later


def test_rng_types_are_kept_on_the_shard_loader_and_a_device_not_here_is_refused_early() -> None:
    """Accelerate keeps `rng_types` on the shard and synchronises them at each pass start (the
    2-rank side is in tests/unit/compat/scripts/compat_two_ranks.py).
    A device RNG this machine lacks fails at the first pass there (an assertion, once an
    Accelerator exists), at prepare here."""
    from accelerando.utils import RNGType

    dl = DataLoader(DATA, batch_size=4)
    mine = prepare_data_loader(dl, num_processes=1, process_index=0, rng_types=[RNGType.TORCH])
    reference = theirs.prepare_data_loader(dl, num_processes=1, process_index=0, rng_types=["torch"])
    assert mine.rng_types == reference.rng_types == ["torch"]
    assert epochs(mine, 1) == epochs(their(dl), 1)
    with pytest.raises(ValueError, match=r"rng_types=\['cuda'\]: accepted are \['generator', 'torch'\]"):
        prepare_data_loader(dl, num_processes=1, process_index=0, rng_types=["cuda"])
