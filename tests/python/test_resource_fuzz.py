"""A fuzzer of every resource class (issue 29): hostile arguments to ``allocate`` and
``deallocate`` (negative, huge, float, string and None sizes; bogus, unaligned, foreign and
stale pointers; wrong sizes; garbage streams), drawn by Hypothesis, in any order with correct
calls. Each hostile call ends in one of RMM's exception types, never a crash or a hang, and the
resource keeps working (its correct allocations round-trip and never overlap).

``RRMM_HYPOTHESIS=long`` raises the number of examples (conftest's profiles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rrmm import mr

MiB = 1 << 20


def _sim() -> Any:
    return mr.SimulatedMemoryResource(256 * MiB)


def _callback() -> Any:
    up = _sim()
    return mr.CallbackMemoryResource(
        lambda n, s: up.allocate(n, s), lambda p, n, s: up.deallocate(p, n, s)
    )


#: Every class the fuzzer builds without a GPU: name -> factory.
def _tagged() -> Any:
    def pool() -> Any:
        return mr.ExpandableMemoryResource(reserve_size=128 * MiB, page_size=2 * MiB,
                                           pageable_host=True)
    tagged = mr.TaggedMemoryResource(pool(), "weights")
    tagged.add_tag("kv_cache", pool())
    return tagged


FACTORIES: dict[str, Callable[[], Any]] = {
    "SimulatedMemoryResource": _sim,
    "SystemMemoryResource": mr.SystemMemoryResource,
    "SamHeadroomMemoryResource": lambda: mr.SamHeadroomMemoryResource(MiB),
    "CallbackMemoryResource": _callback,
    "PoolMemoryResource": lambda: mr.PoolMemoryResource(_sim(), MiB, 64 * MiB),
    "FixedSizeMemoryResource": lambda: mr.FixedSizeMemoryResource(_sim(), 4096, 4),
    "BinningMemoryResource": lambda: mr.BinningMemoryResource(_sim(), 8, 14),
    "ArenaMemoryResource": lambda: mr.ArenaMemoryResource(_sim(), 16 * MiB),
    "ExpandableMemoryResource": lambda: mr.ExpandableMemoryResource(
        simulated_capacity=64 * MiB
    ),
    "LimitingResourceAdaptor": lambda: mr.LimitingResourceAdaptor(_sim(), 32 * MiB),
    "LoggingResourceAdaptor": lambda: mr.LoggingResourceAdaptor(_sim(), "/dev/null"),
    "StatisticsResourceAdaptor": lambda: mr.StatisticsResourceAdaptor(_sim()),
    "TrackingResourceAdaptor": lambda: mr.TrackingResourceAdaptor(_sim()),
    "FailureCallbackResourceAdaptor": lambda: mr.FailureCallbackResourceAdaptor(
        _sim(), lambda n: False
    ),
    "FallbackResourceAdaptor": lambda: mr.FallbackResourceAdaptor(
        mr.SimulatedMemoryResource(4 * MiB), _sim()
    ),
    "PrefetchResourceAdaptor": lambda: mr.PrefetchResourceAdaptor(_sim()),
    # Two tags, each an expandable pool over host memory of its own (the current tag: none,
    # the first tag's pool).
    "TaggedMemoryResource": lambda: _tagged(),
    "TieredMemoryResource": lambda: mr.TieredMemoryResource(
        mr.SimulatedMemoryResource(4 * MiB), [mr.SimulatedMemoryResource(4 * MiB), _sim()]
    ),
    "AlignedResourceAdaptor": lambda: mr.AlignedResourceAdaptor(_sim(), 4096, 8192),
}

#: Classes that need a GPU to be built (the GPU suites drive them).
GPU_ONLY = {
    "CudaMemoryResource",
    "PeerMemoryResource",
    "ManagedMemoryResource",
    "PinnedHostMemoryResource",
    "CudaAsyncMemoryResource",
    "CudaAsyncViewMemoryResource",
    "CudaAsyncManagedMemoryResource",
}

#: The size granule of a class's frees, where it is not 256 bytes (its block).
GRANULE = {"FixedSizeMemoryResource": 4096}


def _bin(size: int) -> int | None:
    """The bin (block size) of the binning factory's 2**8..2**14 bins that takes ``size``, or
    None for a size its pool serves."""
    block = 1 << 8
    while block < size:
        block <<= 1
    return block if block <= 1 << 14 else None

#: What a hostile call may raise (RMM's types).
REFUSALS = (MemoryError, ValueError, TypeError, OverflowError, RuntimeError, IndexError)

sizes = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 255, 256, 4096, MiB, 2**63, 2**64 - 1, 2**64, -1]),
    st.floats(allow_nan=True),
    st.sampled_from(["1MiB", "x", "", None, b"1", [1]]),
)
pointers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 0x1000, 2**63, 2**64 - 256, 2**64, -256]),
    st.floats(allow_nan=True),
    st.sampled_from(["0x1000", None]),
)
streams = st.one_of(st.none(), st.integers(-5, 2**64 + 5), st.sampled_from(["s", 1.5, object()]))

calls = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), sizes, streams),
        st.tuples(st.just("deallocate_bogus"), pointers, sizes),
        st.tuples(st.just("deallocate_wrong_size"), st.integers(0, 20), sizes),
        st.tuples(st.just("deallocate_twice"), st.integers(0, 20), st.none()),
        st.tuples(st.just("good"), st.integers(1, 2 * MiB), st.none()),
        st.tuples(st.just("free_good"), st.integers(0, 20), st.none()),
    ),
    max_size=30,
)


@pytest.mark.parametrize("name", sorted(FACTORIES))
@given(program=calls)
def test_hostile_calls_are_refused_and_change_nothing(name: str, program: list[Any]) -> None:
    r = FACTORIES[name]()
    live: list[tuple[int, int]] = []
    freed: list[tuple[int, int]] = []
    for op, a, b in program:
        if op == "allocate":
            try:
                args = (a,) if b is None else (a, b)
                p = r.allocate(*args)
            except REFUSALS:
                continue
            assert isinstance(a, int) and a >= 0, f"allocate({a!r}) was accepted"
            live.append((p, a))
        elif op == "good":
            try:
                p = r.allocate(a)
            except MemoryError:
                continue
            assert p % 256 == 0
            for q, n in live:
                assert not (n and a and q < p + a and p < q + n), "overlap"
            live.append((p, a))
        elif op == "free_good" and live:
            p, n = live.pop(a % len(live))
            r.deallocate(p, n)
            freed.append((p, n))
        elif op == "deallocate_bogus":
            if isinstance(a, int) and any(q <= a < q + max(n, 1) for q, n in live):
                continue  # an address inside a live block: not bogus
            try:
                r.deallocate(a, b)
            except REFUSALS:
                pass
        elif op == "deallocate_wrong_size" and live:
            p, n = live[a % len(live)]
            # A size that rounds to the same granule names the same block (the arena and the
            # pools keep sizes rounded to 256 bytes, a fixed-size resource one block for any
            # size that fits, as RMM's do).
            g = GRANULE.get(name, 256)
            if not isinstance(b, int) or n == 0 or (b + g - 1) // g == (n + g - 1) // g:
                continue
            if name == "BinningMemoryResource" and _bin(b) is not None and _bin(b) == _bin(n):
                continue  # one fixed-size bin holds both sizes: the same block
            with pytest.raises(REFUSALS):
                r.deallocate(p, b)
        elif op == "deallocate_twice" and freed:
            p, n = freed[a % len(freed)]
            if n == 0 or any(q <= p < q + max(m, 1) for q, m in live):
                continue
            with pytest.raises(REFUSALS):
                r.deallocate(p, n)
    for p, n in live:
        r.deallocate(p, n)
    p = r.allocate(256)
    r.deallocate(p, 256)
