"""The Accelerator's view of the job's mesh under Accelerate's names: the ParallelismConfig, the
`DeviceMesh`, each dimension's rank (pure arithmetic on the mesh shape, no collective) and
`maybe_context_parallel`."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from accelerando.config.resolve import ResolvedConfig


class MeshViews:
    """Mixed into `Accelerator`; reads `self.config` and the strategy's mesh."""

    config: ResolvedConfig
    strategy: Any
    device: Any
    is_fsdp2: Any
    is_local_main_process: Any

    @property
    def parallelism_config(self) -> Any:
        return self.config.parallelism

    @property
    def torch_device_mesh(self) -> Any:
        """The job's `DeviceMesh` (dp_replicate, dp_shard, cp, tp; flattened dp, dp_shard_cp, dp_cp) once
        built: with a ParallelismConfig at construction, else when a strategy first needs it; or None."""
        mesh = self.strategy.ctx.mesh
        return mesh.device_mesh if mesh.built else None

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return bool(self.is_fsdp2)

    @property
    def should_save_model(self) -> bool:
        """Every rank takes part in saving (sharded saves are collective), as in Accelerate."""
        return True if self.parallelism_config is not None else bool(self.is_local_main_process)

    def _mesh_rank(self, dims: str) -> int:
        if self.parallelism_config is None:
            raise RuntimeError(f"{dims} parallelism is not configured. Set `parallelism_config` first.")
        mesh = self.strategy.ctx.mesh
        return mesh.shape.local_rank(dims, mesh.rank)

    @property
    def tensor_parallel_rank(self) -> int:
        return self._mesh_rank("tp")

    @property
    def context_parallel_rank(self) -> int:
        return self._mesh_rank("cp")

    @property
    def data_parallel_shard_rank(self) -> int:
        return self._mesh_rank("dp_shard")

    @property
    def pipeline_parallel_rank(self) -> int:
        raise NotImplementedError("Pipeline parallelism is currently not supported in accelerando.")

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any) -> Any:
        """Accelerate's hook for a loader prepared apart from the model under DeepSpeed sequence
        parallelism; `dl` itself, since `sp_size > 1` is refused when the Accelerator is built."""
        return dl

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[Any]:
        """Split `buffers` along the `cp` mesh for one step (cp_size > 1; no effect otherwise)."""
        from accelerando.parallel.context_parallel import context_parallel_context

        handler = self.parallelism_config.cp_handler if self.parallelism_config is not None else None
        strategy = getattr(handler, "cp_comm_strategy", None) or "allgather"
        return context_parallel_context(
            self.strategy.ctx.mesh, self.device, strategy, buffers, buffer_seq_dims, no_restore_buffers
        )
