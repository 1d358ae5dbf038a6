"""The pure sharding math against brute-force simulations, for every small configuration."""

from __future__ import annotations

import itertools
import random

import pytest

from accelerando.data import sharding as sh

WORLDS = (1, 2, 3)
SIZES = (1, 2, 3, 4)


def _specs():
    for n, b, split, even, drop in itertools.product(
        WORLDS, SIZES, (False, True), (False, True), (False, True)
    ):
        if split and b % n:
            continue
        yield n, b, split, even, drop


def reference(
    indices: list[int], n: int, b: int, split: bool, even: bool, drop: bool
) -> list[list[list[int]]]:
    """Batch-level simulation of the documented semantics (torch BatchSampler, then sharding)."""
    even = even and n > 1  # one process is never padded
    batches = [indices[i : i + b] for i in range(0, len(indices), b)]
    if drop:
        batches = [x for x in batches if len(x) == b]
    out: list[list[list[int]]] = [[] for _ in range(n)]
    cycle = itertools.cycle(indices) if indices else iter(())
    if split:
        p = b // n
        for x in batches:
            if len(x) < b and even:
                x = x + [next(cycle) for _ in range(b - len(x))]
            for r in range(n):
                if x[r * p : (r + 1) * p]:
                    out[r].append(x[r * p : (r + 1) * p])
        return out
    rounds = [batches[i : i + n] for i in range(0, len(batches), n)]
    for rnd in rounds:
        complete = len(rnd) == n and all(len(x) == b for x in rnd)
        if complete:
            for r in range(n):
                out[r].append(rnd[r])
            continue
        if drop:
            break
        flat = [i for x in rnd for i in x]
        if even:
            flat += [next(cycle) for _ in range(n * b - len(flat))]
        for r in range(n):
            if flat[r * b : (r + 1) * b]:
                out[r].append(flat[r * b : (r + 1) * b])
    return out


@pytest.mark.parametrize("n,b,split,even,drop", list(_specs()))
def test_element_model_matches_reference(n: int, b: int, split: bool, even: bool, drop: bool) -> None:
    rng = random.Random(n * 1000 + b)
    for length in range(0, 3 * n * b + 2):
        idx = list(range(100, 100 + length))
        rng.shuffle(idx)
        ref = reference(idx, n, b, split, even, drop)
        for r in range(n):
            spec = sh.ShardSpec(r, n, b, split, even, drop)
            got = list(sh.iter_rank_batches(idx, spec))
            assert got == ref[r], (length, r)
            assert sh.num_batches(length, spec) == len(ref[r])
            for start in range(len(ref[r]) + 2):
                assert list(sh.iter_rank_batches(idx, spec, start)) == ref[r][start:]
            for k, batch in enumerate(ref[r]):
                assert sh.rank_batch(idx, spec, k) == batch
            flat = [i for x in ref[r] for i in x]
            assert list(sh.iter_rank_stream(iter(idx), spec)) == flat
            for skip in range(len(ref[r]) + 1):
                assert list(sh.iter_rank_stream(iter(idx), spec, skip)) == [
                    i for x in ref[r][skip:] for i in x
                ]
        _check_properties(idx, ref, sh.ShardSpec(0, n, b, split, even, drop))


def _check_properties(idx: list[int], ref: list[list[list[int]]], spec: sh.ShardSpec) -> None:
    counts = {len(x) for x in ref}
    union = [i for rank in ref for batch in rank for i in batch]
    if spec.even_batches or spec.drop_last:
        assert len(counts) == 1, "every rank runs the same number of steps"
    if not spec.even_batches and not spec.drop_last:
        assert sorted(union) == sorted(idx), "each sample exactly once"
    if spec.drop_last:
        assert len(union) == len(set(union))
        assert len(union) == (len(idx) // spec.global_size) * spec.global_size
    # gather_for_metrics contract: all ranks' batches in step order, the final step cut to `remainder`
    rem = sh.remainder(len(idx), spec)
    gathered: list[int] = []
    steps = max(counts) if counts else 0
    for k in range(steps):
        step = [i for rank in ref for i in (rank[k] if k < len(rank) else [])]
        gathered += step[:rem] if (k == steps - 1 and rem) else step
    if not spec.drop_last:
        assert gathered == [i for i in idx] if spec.even_batches else sorted(gathered) == sorted(idx)


@pytest.mark.parametrize("n,b,split,even,drop", list(_specs()))
def test_global_batches_and_pieces(n: int, b: int, split: bool, even: bool, drop: bool) -> None:
    for length in range(0, 2 * n * b + 3):
        idx = list(range(length))
        spec = sh.ShardSpec(0, n, b, split, even, drop)
        ref = reference(idx, n, b, split, even, drop)
        chunks = list(sh.iter_global_batches(iter(idx), spec))
        for k, (chunk, real) in enumerate(chunks):
            for r in range(n):
                bounds = sh.piece_bounds(len(chunk), spec, r)
                expect = ref[r][k] if k < len(ref[r]) else None
                assert (chunk[bounds[0] : bounds[1]] if bounds else None) == expect
            if real < len(chunk):
                assert real == sh.remainder(length, spec)
        assert len(chunks) == max((len(x) for x in ref), default=0)


def rr_reference(batches: list[list[int]], n: int, even: bool, drop: bool) -> list[list[list[int]]]:
    even = even and n > 1
    out: list[list[list[int]]] = [[] for _ in range(n)]
    for i, x in enumerate(batches):
        out[i % n].append(x)
    full = len(batches) // n
    if len(batches) % n:
        if drop:
            out = [x[:full] for x in out]
        elif even:
            pads = itertools.cycle(batches)
            for r in range(len(batches) % n, n):
                out[r].append(next(pads))
    return out


@pytest.mark.parametrize("n,even,drop", list(itertools.product(WORLDS, (False, True), (False, True))))
def test_round_robin_matches_reference(n: int, even: bool, drop: bool) -> None:
    rng = random.Random(n)
    for count in range(0, 3 * n + 2):
        batches = [[rng.randrange(1000) for _ in range(rng.randint(1, 5))] for _ in range(count)]
        ref = rr_reference(batches, n, even, drop)
        for r in range(n):
            spec = sh.ShardSpec(r, n, 4, False, even, drop)
            sink: list[int] = []
            got = [x for x, _ in sh.iter_round_robin(iter(batches), spec, sink=sink)]
            assert got == ref[r]
            assert sh.round_robin_len(count, spec) == len(ref[r])
            for skip in range(len(ref[r]) + 1):
                assert [x for x, _ in sh.iter_round_robin(iter(batches), spec, skip)] == ref[r][skip:]
            if even and n > 1 and not drop and count % n:
                assert sink == [sum(len(x) for x in batches[count - count % n :])]


@pytest.mark.parametrize("n,even,drop", list(itertools.product((1, 2, 4), (False, True), (False, True))))
def test_split_custom_batches(n: int, even: bool, drop: bool) -> None:
    b = 4
    for length in range(0, 14):
        idx = list(range(length))
        batches = [idx[i : i + b] for i in range(0, length, b)]
        if drop:
            batches = [x for x in batches if len(x) == b]
        ref = reference(idx, n, b, True, even, drop)
        for r in range(n):
            spec = sh.ShardSpec(r, n, b, True, even, drop)
            assert list(sh.iter_split(iter(batches), spec, full_size=b)) == ref[r]
            for skip in range(len(ref[r]) + 1):
                assert list(sh.iter_split(iter(batches), spec, skip, full_size=b)) == ref[r][skip:]


def test_bad_specs_name_the_value() -> None:
    with pytest.raises(
        ValueError, match=r"batch size \(3\) needs to be a round multiple of the number of processes \(2\)"
    ):
        sh.ShardSpec(0, 2, 3, split_batches=True)
    with pytest.raises(ValueError, match="rank=2"):
        sh.ShardSpec(2, 2, 4)
    with pytest.raises(ValueError, match="batch_size=0"):
        sh.ShardSpec(0, 1, 0)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        list(sh.iter_split(iter([[0, 1, 2]]), sh.ShardSpec(0, 2, 4, True)))
