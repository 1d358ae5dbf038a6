"""The DDP model's group keeper (strategies/ddp.py) never carries a process group into a copy or a pickle."""

from __future__ import annotations

import copy
import pickle

from accelerando.strategies.ddp import GroupKeeper


def test_group_keeper_copies_and_pickles_empty() -> None:
    keeper = GroupKeeper(object())  # stands for a process group, which cannot be pickled
    assert pickle.loads(pickle.dumps(keeper)).group is None
    assert copy.deepcopy(keeper).group is None
    assert copy.copy(keeper).group is None
