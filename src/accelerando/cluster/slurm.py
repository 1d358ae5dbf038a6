"""Processes started by `srun` (one task per process), without torchrun in between."""

from __future__ import annotations

import re

from accelerando.cluster.base import ClusterEnvironment, ProcessTopology


def first_hostname(nodelist: str) -> str:
    """First host of a SLURM node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        raise ValueError(f"cannot parse SLURM node list {nodelist!r}")
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """Tasks on `node` from SLURM's compressed form: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"cannot parse SLURM tasks-per-node {tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else counts[-1]


class SlurmEnvironment(ClusterEnvironment):
    name = "slurm"

    def detect(self) -> bool:
        # sbatch alone sets SLURM_JOB_ID; only srun-started tasks have a step and a task id.
        return (
            "SLURM_PROCID" in self.env
            and "SLURM_STEP_ID" in self.env
            and self._int("SLURM_NTASKS", default=1) > 1
        )

    def topology(self) -> ProcessTopology:
        node = self._int("SLURM_NODEID", default=0)
        per_node = self.env.get("SLURM_STEP_TASKS_PER_NODE") or self.env.get("SLURM_TASKS_PER_NODE") or "1"
        nodelist = self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_NODELIST") or "127.0.0.1"
        job_id = self._int("SLURM_JOB_ID", default=0)
        return ProcessTopology(
            rank=self._int("SLURM_PROCID"),
            local_rank=self._int("SLURM_LOCALID", default=0),
            world_size=self._int("SLURM_NTASKS"),
            local_world_size=tasks_on_node(per_node, node),
            node_rank=node,
            num_nodes=self._int("SLURM_STEP_NUM_NODES", "SLURM_NNODES", default=1),
            main_address=self.env.get("MASTER_ADDR") or first_hostname(nodelist),
            # A job-specific port avoids collisions between jobs sharing a node.
            main_port=self._int("MASTER_PORT", default=15000 + job_id % 20000),
            source=self.name,
        )
