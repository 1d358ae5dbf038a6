"""Processes started by torchrun / torchelastic (and `accelerando launch`, which drives its agent)."""

from __future__ import annotations

from accelerando.cluster.base import ClusterEnvironment, ProcessTopology


class TorchElasticEnvironment(ClusterEnvironment):
    name = "torchelastic"

    def detect(self) -> bool:
        return all(k in self.env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))

    def topology(self) -> ProcessTopology:
        world = self._int("WORLD_SIZE")
        local_world = self._int("LOCAL_WORLD_SIZE", default=world)
        return ProcessTopology(
            rank=self._int("RANK"),
            local_rank=self._int("LOCAL_RANK"),
            world_size=world,
            local_world_size=local_world,
            node_rank=self._int("GROUP_RANK", default=0),
            num_nodes=self._int("GROUP_WORLD_SIZE", default=max(1, world // max(local_world, 1))),
            main_address=self.env.get("MASTER_ADDR", "127.0.0.1"),
            main_port=self._port(),
            source=self.name,
        )
