from collections import namedtuple

import pytest
import torch

from accelerando.ops import collectives
from accelerando.ops.tree import concatenate, find_batch_size, recursively_apply, send_to_device, tree_leaves


def test_tree_helpers_keep_containers():
    Pair = namedtuple("Pair", "a b")
    data = {"x": [torch.ones(2, 3), Pair(torch.zeros(2), "tag")], "n": 3}
    doubled = recursively_apply(lambda t: t * 2, data)
    assert isinstance(doubled["x"][1], Pair) and doubled["x"][1].b == "tag" and doubled["n"] == 3
    assert len(tree_leaves(data)) == 2
    assert find_batch_size(data) == 2
    moved = send_to_device(data, "cpu")
    assert moved["x"][0].device.type == "cpu"
    cat = concatenate([{"a": torch.ones(1, 2)}, {"a": torch.zeros(2, 2)}])
    assert cat["a"].shape == (3, 2)
    with pytest.raises(TypeError, match="Only nested"):
        recursively_apply(lambda t: t, object(), error_on_other_type=True)


def test_single_process_collectives_are_identity():
    t = torch.arange(4)
    assert torch.equal(collectives.gather(t), t)
    assert collectives.gather(torch.tensor(3.0)).shape == (1,)
    assert collectives.gather_object([1, 2]) == [1, 2]
    assert torch.equal(collectives.reduce(t, "mean"), t.float() if t.is_floating_point() else t)
    assert torch.equal(collectives.reduce(torch.ones(2), "sum", scale=3.0), torch.full((2,), 3.0))
    with pytest.raises(ValueError, match="reduction='avg'"):
        collectives.reduce(t, "avg")
