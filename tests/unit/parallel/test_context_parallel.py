"""maybe_context_parallel: the checks on its buffers and the refusal off CUDA and CPU (pure, no process
group); the block itself runs on 2 gloo ranks in tests/distributed/scripts/tp_mesh.py."""

from __future__ import annotations

import pytest
import torch

from accelerando import Accelerator
from accelerando.parallel.context_parallel import context_parallel_context
from accelerando.parallel.mesh import MeshShape, ParallelMesh

CPU = torch.device("cpu")


def _cp2() -> ParallelMesh:
    return ParallelMesh(MeshShape(cp=2), 1, "cpu")


def test_buffers_are_checked_naming_the_sizes() -> None:
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="1 buffers but 2 buffer_seq_dims"):
        context_parallel_context(_cp2(), CPU, "allgather", [ids], [1, 1])
    with pytest.raises(ValueError, match=r"shape \(2, 8\): no dimension 2"):
        context_parallel_context(_cp2(), CPU, "allgather", [ids], [2])
    with pytest.raises(ValueError, match=r"sequence length 6 .* divisible by 2 x cp_size = 4"):
        context_parallel_context(_cp2(), CPU, "allgather", [torch.zeros(2, 6)], [1])
    with pytest.raises(ValueError, match="no_restore_buffers must be a subset"):
        context_parallel_context(_cp2(), CPU, "allgather", [ids], [1], {torch.zeros(1)})


def test_other_devices_are_refused_with_the_reason() -> None:
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(
        RuntimeError, match=r"context parallelism \(cp_size=2\) cannot run on mps.*cuda, cpu only"
    ):
        context_parallel_context(_cp2(), torch.device("mps"), "allgather", [ids], [1], {ids})


def test_without_cp_it_is_a_no_op_that_says_so() -> None:
    import accelerando.parallel.context_parallel as cp

    cp._warned = False
    acc = Accelerator(cpu=True)
    with pytest.warns(UserWarning, match="Context parallel training is not enabled"):
        with acc.maybe_context_parallel(buffers=[torch.zeros(2, 3)], buffer_seq_dims=[1]):
            pass


def test_on_cpu_attention_inside_the_block_is_unmasked_and_math_only() -> None:
    """The wrapper around torch's patched attention (here: the plain one): unmasked calls pass through
    on the math backend, causal or masked calls are refused naming why; the function is restored."""
    import contextlib

    import torch.nn.functional as F

    from accelerando.parallel.context_parallel import _unmasked_math_attention

    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 8, 4)
    with _unmasked_math_attention(contextlib.nullcontext(), cp=2):
        assert F.scaled_dot_product_attention is not original
        torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q), original(q, q, q))
        for call in (
            lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
            lambda: F.scaled_dot_product_attention(q, q, q, None, 0.0, True),
            lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool)),
        ):
            with pytest.raises(RuntimeError, match=r"cp_size=2\) on cpu runs attention without a mask only"):
                call()
    assert F.scaled_dot_product_attention is original
