"""The one authority on topology: how the ranks of a job split into parallel dimensions.

`MeshShape` is pure data (sizes of `dp_replicate`, `dp_shard`, `cp`, `tp`, validated once against
the world size) with the rank arithmetic every "which rank, which group" question needs.
`ParallelMesh` adds this process's rank and builds the `torch.distributed` `DeviceMesh` only when a
component asks for a sub-mesh, so plain data parallelism never creates a process group of its own.

Ranks are laid out row-major over `MESH_DIMS`, `tp` varying fastest: the ranks of one tensor
parallel group are neighbours (one node), those of one replica group are farthest apart. The
flattened dimensions are Accelerate's: `dp` (the ranks that read different data), `dp_shard_cp`
(what FSDP shards parameters over) and `dp_cp` (what the loss is averaged over).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")
DP_DIMS = ("dp_replicate", "dp_shard")
FLAT_DIMS = {
    "dp": DP_DIMS,
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the parallel dimensions; their product is the world size."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    @classmethod
    def resolve(
        cls, world_size: int, *, dp_replicate: int = 1, dp_shard: int = -1, cp: int = 1, tp: int = 1
    ) -> MeshShape:
        """Validate the sizes against `world_size`; one size may be -1, meaning "the remaining ranks"."""
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world size must be an integer >= 1, got {world_size!r}")
        sizes = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
        bad = {k: v for k, v in sizes.items() if not _is_size(v)}
        if bad:
            raise ValueError(
                f"mesh sizes must be integers >= 1 (or -1 for the remaining ranks), got {_describe(bad)}"
            )
        rest = [k for k, v in sizes.items() if v == -1]
        if len(rest) > 1:
            raise ValueError(f"only one mesh size may be -1 (the remaining ranks), got {_describe(sizes)}")
        known = math.prod(v for v in sizes.values() if v != -1)
        if rest:
            if world_size % known:
                raise ValueError(
                    f"mesh sizes {_describe({k: v for k, v in sizes.items() if v != -1})} multiply to "
                    f"{known}, which does not divide the world size {world_size}"
                )
            sizes[rest[0]] = world_size // known
        elif known != world_size:
            raise ValueError(
                f"mesh sizes {_describe(sizes)} multiply to {known}, but the world size is {world_size}"
            )
        return cls(**sizes)

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in MESH_DIMS)

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes)

    @property
    def dp_size(self) -> int:
        """Ranks that see different data: replicas times shards."""
        return self.dp_replicate * self.dp_shard

    def size(self, dims: str | tuple[str, ...]) -> int:
        return math.prod(getattr(self, d) for d in _expand(dims))

    # ---- rank arithmetic (pure) ---------------------------------------------------------------
    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along every dimension."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")
        coords: dict[str, int] = {}
        for name in reversed(MESH_DIMS):
            rank, coords[name] = divmod(rank, getattr(self, name))
        return {name: coords[name] for name in MESH_DIMS}

    def rank_at(self, coords: dict[str, int]) -> int:
        rank = 0
        for name in MESH_DIMS:
            rank = rank * getattr(self, name) + coords[name]
        return rank

    def local_rank(self, dims: str | tuple[str, ...], rank: int) -> int:
        """`rank`'s index inside its group along `dims` (flattened row-major when several)."""
        coords = self.coordinates(rank)
        index = 0
        for name in _expand(dims):
            index = index * getattr(self, name) + coords[name]
        return index

    def group_ranks(self, dims: str | tuple[str, ...], rank: int) -> list[int]:
        """The global ranks that share `rank`'s coordinates on every dimension except `dims`."""
        names = _expand(dims)
        base = self.coordinates(rank)
        ranks = []
        for index in range(self.size(names)):
            coords = dict(base)
            for name in reversed(names):
                index, coords[name] = divmod(index, getattr(self, name))
            ranks.append(self.rank_at(coords))
        return ranks

    def groups(self, dims: str | tuple[str, ...]) -> list[list[int]]:
        """Every group along `dims`, each once, in order of its first rank: a partition of the world."""
        seen: dict[tuple[int, ...], None] = {}
        for rank in range(self.world_size):
            seen.setdefault(tuple(self.group_ranks(dims, rank)), None)
        return [list(group) for group in seen]

    def describe(self) -> str:
        return _describe({f.name: getattr(self, f.name) for f in fields(self)})


class ParallelMesh:
    """A validated `MeshShape` seen from one rank; the `DeviceMesh` is built on first use."""

    def __init__(self, shape: MeshShape, rank: int, device_type: str) -> None:
        shape.coordinates(rank)  # validates the rank against the shape
        self.shape = shape
        self.rank = rank
        self.device_type = device_type
        self._root: Any = None
        self._flat: dict[str, Any] = {}

    @property
    def data_parallel_size(self) -> int:
        return self.shape.dp_size

    @property
    def data_parallel_rank(self) -> int:
        return self.shape.local_rank(DP_DIMS, self.rank)

    def data_parallel_ranks(self) -> list[int]:
        return self.shape.group_ranks(DP_DIMS, self.rank)

    @property
    def built(self) -> bool:
        """Whether the `DeviceMesh` exists already (asking for it would not be collective)."""
        return self._root is not None

    @property
    def device_mesh(self) -> Any:
        """The whole `DeviceMesh` over `MESH_DIMS` (collective on first use: every rank must ask)."""
        if self._root is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._root = init_device_mesh(self.device_type, self.shape.sizes, mesh_dim_names=MESH_DIMS)
        return self._root

    def build(self) -> Any:
        """The `DeviceMesh` with every flattened dimension registered, so that any rank can later look
        up `mesh["dp"]` (or `dp_shard_cp`, `dp_cp`) on the root without a collective (Accelerate's
        `torch_device_mesh`)."""
        for name in FLAT_DIMS:
            self[name]
        return self.device_mesh

    def __getitem__(self, name: str | tuple[str, ...]) -> Any:
        """A named sub-mesh: one of `MESH_DIMS`, a tuple of them in order, or the flattened `dp`."""
        if isinstance(name, str) and name in FLAT_DIMS:
            if name not in self._flat:
                self._flat[name] = self.device_mesh[FLAT_DIMS[name]]._flatten(name)
            return self._flat[name]
        dims = _expand(name)
        unknown = [d for d in dims if d not in MESH_DIMS]
        if unknown:
            raise KeyError(f"no mesh dimension {unknown}; known: {', '.join((*MESH_DIMS, *FLAT_DIMS))}")
        return self.device_mesh[name]

    def data_parallel_group(self) -> Any:
        """The data-parallel process group, or None (the default group) when it spans every rank."""
        if self.shape.dp_size == self.shape.world_size:
            return None
        return self["dp"].get_group()

    def __repr__(self) -> str:
        return f"ParallelMesh({self.shape.describe()}, rank={self.rank})"


def _expand(dims: str | tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(dims, str):
        return FLAT_DIMS.get(dims, (dims,))
    return tuple(d for name in dims for d in _expand(name))


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or value == -1)


def _describe(sizes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sizes.items())
