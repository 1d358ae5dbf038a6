"""Cluster environments (torchrun, SLURM, MPI, local) and the process topology they describe."""

from accelerando.cluster.base import ClusterEnvironment, ProcessTopology
from accelerando.cluster.detect import detect_environment, detect_topology

__all__ = ["ClusterEnvironment", "ProcessTopology", "detect_environment", "detect_topology"]
