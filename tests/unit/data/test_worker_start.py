"""A forked DataLoader worker stuck before it runs is forked again; the pass's batches do not change.

The stuck worker is made the way CPython's after-fork deadlock (gh-112275) leaves one: an
`os.register_at_fork` child hook, which runs in the interpreter's after-fork code, never returns in
the chosen children.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from accelerando.data.prepare import prepare_data_loader
from accelerando.data.worker_start import ATTEMPTS, TIMEOUT_VARIABLE

_FORKS = {"stick": 0, "this_one": False}  # the next `stick` forks of this process never start


def _before_fork() -> None:
    _FORKS["this_one"] = _FORKS["stick"] > 0
    _FORKS["stick"] = max(0, _FORKS["stick"] - 1)


def _after_fork_in_parent() -> None:
    _FORKS["this_one"] = False


def _after_fork_in_child() -> None:
    if _FORKS["this_one"]:
        time.sleep(3600)


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


class Draws(Dataset):
    """Sample i with a draw from the worker's torch RNG: equal only if the worker's seed is."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i), torch.rand(()).item(), float(get_worker_info().id)])


def _loader(stateful: bool = False, **kwargs) -> DataLoader:
    base = DataLoader(Draws(), batch_size=4, shuffle=True, num_workers=2, **kwargs)
    return prepare_data_loader(base, put_on_device=False, use_stateful_dataloader=stateful, data_seed=3)


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ACCELERANDO_" + TIMEOUT_VARIABLE, "1")
    yield
    _FORKS["stick"] = 0


@pytest.mark.parametrize("stateful", [False, True])
def test_a_worker_stuck_after_fork_is_forked_again_and_the_pass_is_unchanged(
    short_wait, stateful: bool
) -> None:
    reference = [b.tolist() for b in _loader(stateful)]
    dl = _loader(stateful)
    _FORKS["stick"] = 1  # worker 0 of the next pass
    with pytest.warns(
        RuntimeWarning, match=r"worker 0 \(pid \d+\) did not start within 1 s .* forked it again"
    ):
        batches = [b.tolist() for b in dl]
    assert _FORKS["stick"] == 0
    assert batches == reference
    assert {row[2] for batch in batches for row in batch} == {0.0, 1.0}  # both workers served
    assert multiprocessing.active_children() == []


# torch's __del__ of its half-built iterator complains; the error raised is what is checked
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_worker_that_never_starts_ends_the_pass_with_a_clear_error_and_no_process_left(short_wait) -> None:
    dl = _loader()
    _FORKS["stick"] = 100
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError) as caught:
        next(iter(dl))
    message = str(caught.value)
    del caught
    gc.collect()  # the half-built iterator goes here, under this test's filter
    assert f"did not start within 1 s of being forked, {ATTEMPTS} times in a row" in message
    assert "gh-112275" in message and "multiprocessing_context='forkserver'" in message
    assert TIMEOUT_VARIABLE in message
    _FORKS["stick"] = 0
    assert multiprocessing.active_children() == []
    assert len(list(dl)) == 6  # the loader still works once forks start again


def test_the_users_worker_init_fn_runs_in_each_worker_and_stays_the_loaders(short_wait) -> None:
    seen = multiprocessing.get_context("fork").SimpleQueue()

    def init(worker_id: int) -> None:
        seen.put(worker_id)

    dl = _loader(worker_init_fn=init, persistent_workers=True)
    for _ in range(2):  # persistent: the second pass forks nothing and waits for nothing
        assert len(list(dl)) == 6
        assert dl.worker_init_fn is init
    assert sorted(seen.get() for _ in range(2)) == [0, 1]
    assert seen.empty()
