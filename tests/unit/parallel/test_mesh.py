"""The mesh authority: size validation and sub-mesh rank lists for every shape up to 16 ranks.

The pure rank arithmetic is checked exhaustively; a selection of shapes is also built as a real
`DeviceMesh` over torch's fake process group (one process playing one rank), so the sub-meshes
torch builds are compared with the ones the pure functions predict.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch.distributed as dist

from accelerando.parallel.mesh import DP_DIMS, MESH_DIMS, MeshShape, ParallelMesh


def shapes(world: int) -> list[MeshShape]:
    """Every ordered factorisation of `world` into (dp_replicate, dp_shard, cp, tp)."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    return [MeshShape(*sizes) for sizes in itertools.product(divisors, repeat=4) if math.prod(sizes) == world]


ALL_SHAPES = [shape for world in range(1, 17) for shape in shapes(world)]


def test_every_factorisation_validates_and_fills_the_rest() -> None:
    for shape in ALL_SHAPES:
        world = shape.world_size
        assert MeshShape.resolve(world, **_sizes(shape)) == shape
        for dim in MESH_DIMS:  # any one size may be left to "the remaining ranks"
            assert MeshShape.resolve(world, **{**_sizes(shape), dim: -1}) == shape
    assert len(shapes(16)) == 35 and len(ALL_SHAPES) == sum(len(shapes(w)) for w in range(1, 17))


@pytest.mark.parametrize(
    ("world", "sizes", "message"),
    [
        (8, {"tp": 3}, r"tp=3 multiply to 3, which does not divide the world size 8"),
        (8, {"dp_replicate": 2, "dp_shard": 2, "tp": 1}, r"multiply to 4, but the world size is 8"),
        (16, {"dp_replicate": 4, "dp_shard": 2, "tp": 4}, r"multiply to 32, but the world size is 16"),
        (4, {"dp_replicate": -1, "dp_shard": -1}, r"only one mesh size may be -1"),
        (4, {"tp": 0}, r"integers >= 1 .* tp=0"),
        (4, {"cp": -2}, r"cp=-2"),
        (4, {"tp": 2.0}, r"tp=2.0"),
        (4, {"tp": True}, r"tp=True"),
        (0, {}, r"world size must be an integer >= 1, got 0"),
    ],
)
def test_bad_sizes_are_refused_naming_the_numbers(world: int, sizes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MeshShape.resolve(world, **sizes)


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
def test_groups_partition_the_world_along_each_dimension(shape: MeshShape) -> None:
    world = shape.world_size
    ranks = list(range(world))
    assert [shape.rank_at(shape.coordinates(r)) for r in ranks] == ranks
    for dims in [*MESH_DIMS, "dp", ("cp", "tp")]:
        groups = shape.groups(dims)
        size = shape.size(dims)
        assert sorted(r for g in groups for r in g) == ranks
        assert all(len(g) == size for g in groups) and len(groups) == world // size
        names = DP_DIMS if dims == "dp" else ((dims,) if isinstance(dims, str) else dims)
        for group in groups:
            for position, rank in enumerate(group):
                coords = shape.coordinates(rank)
                first = shape.coordinates(group[0])
                # members differ only along `dims`, and their index in the group is their local rank
                assert all(coords[d] == first[d] for d in MESH_DIMS if d not in names)
                assert shape.local_rank(dims, rank) == position
                assert shape.group_ranks(dims, rank) == group


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
def test_data_parallel_rank_and_size(shape: MeshShape) -> None:
    seen = set()
    for rank in range(shape.world_size):
        mesh = ParallelMesh(shape, rank, "cpu")
        assert mesh.data_parallel_size == shape.dp_replicate * shape.dp_shard
        assert mesh.data_parallel_rank == mesh.data_parallel_ranks().index(rank)
        coords = shape.coordinates(rank)
        seen.add((mesh.data_parallel_rank, coords["cp"], coords["tp"]))
    # every (data-parallel rank, cp, tp) cell is one rank: TP/CP peers share a data-parallel rank
    assert len(seen) == shape.world_size


def test_layout_is_row_major_with_tp_fastest() -> None:
    shape = MeshShape(dp_replicate=2, dp_shard=2, cp=2, tp=2)
    assert shape.group_ranks("tp", 5) == [4, 5]
    assert shape.group_ranks("cp", 5) == [5, 7]
    assert shape.group_ranks("dp_shard", 5) == [1, 5]
    assert shape.group_ranks("dp_replicate", 5) == [5, 13]
    assert shape.group_ranks("dp", 5) == [1, 5, 9, 13]
    assert shape.coordinates(13) == {"dp_replicate": 1, "dp_shard": 1, "cp": 0, "tp": 1}


def test_a_rank_outside_the_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rank 8 is outside 0..7"):
        ParallelMesh(MeshShape(dp_shard=8), 8, "cpu")


def test_plain_data_parallelism_builds_no_mesh() -> None:
    mesh = ParallelMesh(MeshShape(dp_replicate=4), 2, "cpu")
    assert mesh.data_parallel_group() is None  # the default group
    assert mesh._root is None


# ---- the same shapes as torch builds them (fake process group, one rank per test) ----------------
FAKE_SHAPES = [
    *shapes(16),
    MeshShape(3, 2, 1, 2),
    MeshShape(1, 6, 2, 1),
    MeshShape(2, 1, 1, 1),
]


def _fake_world(rank: int, world: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


@pytest.mark.parametrize("shape", FAKE_SHAPES, ids=str)
def test_device_mesh_sub_meshes_match_the_pure_rank_lists(shape: MeshShape) -> None:
    world = shape.world_size
    rank = (world * 2) // 3  # a rank inside the mesh, not on its first row
    _fake_world(rank, world)
    try:
        mesh = ParallelMesh(shape, rank, "cpu")
        assert mesh.device_mesh.mesh_dim_names == MESH_DIMS
        for dim in MESH_DIMS:
            assert mesh[dim].mesh.flatten().tolist() == shape.group_ranks(dim, rank), dim
        assert mesh["dp"].mesh.flatten().tolist() == mesh.data_parallel_ranks()
        assert mesh["dp"].get_local_rank() == mesh.data_parallel_rank
        assert mesh[DP_DIMS].mesh.flatten().tolist() == mesh.data_parallel_ranks()
        group = mesh.data_parallel_group()
        if shape.dp_size == world:
            assert group is None
        else:
            assert dist.get_process_group_ranks(group) == mesh.data_parallel_ranks()
        with pytest.raises(KeyError, match="no mesh dimension"):
            mesh["pp"]
    finally:
        dist.destroy_process_group()


def _sizes(shape: MeshShape) -> dict[str, int]:
    return {d: getattr(shape, d) for d in MESH_DIMS}
