"""Who this process is in the job: a frozen `ProcessTopology`, read from a cluster's variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessTopology:
    """Rank layout of the job as the cluster environment describes it."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    main_address: str = "127.0.0.1"
    main_port: int = 29500
    source: str = "local"

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside 0..{self.world_size - 1} (world size {self.world_size})"
            )
        if not 0 <= self.local_rank < max(self.local_world_size, 1):
            raise ValueError(
                f"local rank {self.local_rank} is outside 0..{self.local_world_size - 1} "
                f"(local world size {self.local_world_size}, from {self.source})"
            )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


class ClusterEnvironment:
    """One way a job can be started (torchrun, SLURM, MPI, a plain process). Read-only."""

    name = ""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def detect(self) -> bool:
        raise NotImplementedError

    def topology(self) -> ProcessTopology:
        raise NotImplementedError

    def _int(self, *names: str, default: int | None = None) -> int:
        for name in names:
            value = self.env.get(name)
            if value not in (None, ""):
                try:
                    return int(str(value).split("(")[0].split(",")[0])
                except ValueError:
                    raise ValueError(f"{self.name}: variable {name}={value!r} is not an integer") from None
        if default is None:
            raise ValueError(f"{self.name}: none of {', '.join(names)} is set")
        return default

    def _port(self) -> int:
        return self._int("MASTER_PORT", default=29500)
