"""Issue 46: ``memory_stats()`` and ``memory_snapshot()`` are true for every stack the package can
build (``rrmm._stack`` kinds over a simulated device, and the tagged stack ``rrmm.compat`` sets).
For a random set of allocations: a stack that holds memory counts what its snapshot lays out
(allocated blocks, their bytes, its segments and their bytes), every live allocation among them
(exactly its live allocations where the stack hands out the pool's blocks itself; a binning
stack over a pool reports the pool, whose blocks include the bins' chunks); a stack of a source
alone (no pool) has no PyTorch counters, as documented."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rrmm import _rrmm, _stack, mr

GiB = 1 << 30
#: Kinds whose memory is a source's alone (no pool, no counters), and the tiered resource, whose
#: counts are per tier (``tier_counts``) and which lays out every tier's segments.
SOURCES = {"cuda", "cuda_async", "managed", "pinned", "simulated"}
PER_TIER = {"tiered"}


def kinds() -> list[str]:
    return sorted(_stack.kinds())


def build(kind: str) -> Any:
    return _stack.build(kind, simulate=4 * GiB)


def tagged() -> Any:
    def pool() -> mr.ExpandableMemoryResource:
        return mr.ExpandableMemoryResource(reserve_size=256 << 20, page_size=2 << 20,
                                           pageable_host=True)

    t = mr.TaggedMemoryResource(pool(), "a")
    t.add_tag("b", pool())
    return t


def rounded(n: int) -> int:
    return -(-n // 256) * 256


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["tagged", *kinds()]),
       sizes=st.lists(st.integers(1, 3 << 20), min_size=1, max_size=12))
def test_every_stack_counts_its_live_allocations(kind: str, sizes: list[int]) -> None:
    res = tagged() if kind == "tagged" else build(kind)
    if kind == "fixed_size":
        sizes = [min(n, 1 << 20) for n in sizes]  # one block each, at most its size
    ptrs: list[tuple[int, int]] = []
    for i, n in enumerate(sizes):
        if kind == "tagged":
            res.set_current_tag("b" if i % 2 else None)
        ptrs.append((res.allocate(n), n))
    stats = _rrmm._memory_stats(res)
    snapshot = _rrmm._memory_snapshot(res, 0)
    live = sum(rounded(n) for n in sizes)
    if kind not in SOURCES:
        assert snapshot, (kind, "a stack that holds memory lays it out")
        active = [b["size"] for seg in snapshot for b in seg["blocks"]
                  if b["state"] == "active_allocated"]
        assert sum(active) >= live, (kind, sum(active), live)
    if kind in SOURCES or kind in PER_TIER:
        assert not stats, (kind, "no pool: no PyTorch counters")
    else:
        assert stats["allocation.all.current"] == len(active), (kind, stats)
        assert stats["allocated_bytes.all.current"] == sum(active), (kind, stats)
        assert stats["reserved_bytes.all.current"] == sum(s["total_size"] for s in snapshot)
        assert stats["segment.all.current"] == len(snapshot), (kind, stats)
        if kind != "binning":
            assert stats["allocation.all.current"] == len(sizes), (kind, stats)
    for p, n in ptrs:
        res.deallocate(p, n)
    after = _rrmm._memory_stats(res)
    if after and kind != "binning":
        assert after["allocation.all.current"] == 0, (kind, after)
        assert after["allocated_bytes.all.current"] == 0, (kind, after)
        assert after["allocation.all.allocated"] == after["allocation.all.freed"] >= len(sizes)


@pytest.mark.parametrize("kind", ["arena", "binning", "tagged"])
def test_a_peak_reset_resets_the_stacks_peaks(kind: str) -> None:
    res = tagged() if kind == "tagged" else build(kind)
    big = [res.allocate(1 << 20) for _ in range(4)]
    for p in big:
        res.deallocate(p, 1 << 20)
    assert _rrmm._memory_stats(res)["allocated_bytes.all.peak"] >= 4 << 20
    assert _rrmm._reset_peak_memory_stats(res)
    stats = _rrmm._memory_stats(res)
    assert stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"]
