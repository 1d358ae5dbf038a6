"""Processes started by mpirun / mpiexec (Open MPI, MPICH, Intel MPI, MVAPICH)."""

from __future__ import annotations

from accelerando.cluster.base import ClusterEnvironment, ProcessTopology

# (rank, size, local rank, local size) variable names per MPI family
_FAMILIES = (
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
)


class MpiEnvironment(ClusterEnvironment):
    name = "mpi"

    def _family(self) -> tuple[str, str, str, str] | None:
        for family in _FAMILIES:
            if family[0] in self.env and family[1] in self.env:
                return family
        return None

    def detect(self) -> bool:
        family = self._family()
        return family is not None and self._int(family[1]) > 1

    def topology(self) -> ProcessTopology:
        family = self._family()
        assert family is not None
        rank_name, size_name, local_rank_name, local_size_name = family
        world = self._int(size_name)
        local_world = self._int(local_size_name, default=world)
        rank = self._int(rank_name)
        return ProcessTopology(
            rank=rank,
            local_rank=self._int(local_rank_name, default=rank % local_world),
            world_size=world,
            local_world_size=local_world,
            node_rank=rank // local_world,
            num_nodes=max(1, world // local_world),
            main_address=self.env.get("MASTER_ADDR", "127.0.0.1"),
            main_port=self._port(),
            source=self.name,
        )
