"""Pick the cluster environment that started this process; first match wins."""

from __future__ import annotations

from collections.abc import Mapping

from accelerando.cluster.base import ClusterEnvironment, ProcessTopology
from accelerando.cluster.local import LocalEnvironment
from accelerando.cluster.mpi import MpiEnvironment
from accelerando.cluster.slurm import SlurmEnvironment
from accelerando.cluster.torchelastic import TorchElasticEnvironment

# torchrun inside an sbatch allocation sets both families: torchrun's variables describe the workers.
ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    TorchElasticEnvironment,
    SlurmEnvironment,
    MpiEnvironment,
    LocalEnvironment,
)


def detect_environment(env: Mapping[str, str]) -> ClusterEnvironment:
    for cls in ENVIRONMENTS:
        candidate = cls(env)
        if candidate.detect():
            return candidate
    raise AssertionError("LocalEnvironment always matches")


def detect_topology(env: Mapping[str, str]) -> ProcessTopology:
    """The frozen topology of this process, from a snapshot of its environment."""
    return detect_environment(env).topology()
