"""A plain `python train.py`: one process, rank 0 of 1."""

from __future__ import annotations

from accelerando.cluster.base import ClusterEnvironment, ProcessTopology


class LocalEnvironment(ClusterEnvironment):
    name = "local"

    def detect(self) -> bool:
        return True

    def topology(self) -> ProcessTopology:
        return ProcessTopology(source=self.name)
