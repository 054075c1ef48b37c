"""The GIL around a DeviceBuffer's allocation and free (issue 28's round-trip regression).

A pool answers from its own bookkeeping and reaches its source only to grow, so its calls keep
the GIL even over a source whose own calls block (host memory from the system allocator here,
CUDA memory on a GPU): releasing and taking the GIL back cost ~180 ns of a 280 ns round trip on
an H100. A stack with Python code below still releases it (a thread holding the GIL must never
wait for a lock whose holder needs the GIL), and so does a source called on every allocation.

Observed from another thread that wakes every half millisecond and then needs the GIL: it gets
in during the round trips only when they release the GIL. The switch interval (2 s) is twice the
longest loop (1 s), so the interpreter never hands the GIL over on its own meanwhile; a release
lets the other thread in within a few thousand round trips.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import rrmm

MIB = 1 << 20


def _releases_gil(mr: Any, trips: int = 200_000, seconds: float = 1.0) -> bool:
    """Whether `DeviceBuffer(size=1 MiB, mr=mr)` round trips let another Python thread run."""
    count = [0]
    stop = threading.Event()

    def wake_often() -> None:
        while not stop.is_set():
            time.sleep(0.0005)
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(2 * seconds)
    t = threading.Thread(target=wake_often, daemon=True)
    t.start()
    try:
        time.sleep(0.01)  # the thread runs, then waits for the GIL from the loop's start on
        before = count[0]
        deadline = time.perf_counter() + seconds
        for i in range(trips):
            rrmm.DeviceBuffer(size=MIB, mr=mr)
            if count[0] != before:
                return True
            if i % 256 == 0 and time.perf_counter() > deadline:
                break
        return False
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        t.join()


def _pool(source: Any) -> Any:
    return rrmm.mr.PoolMemoryResource(source, initial_pool_size=64 * MIB)


def _callback_source() -> Any:
    sim = rrmm.mr.SimulatedMemoryResource(1 << 34)
    return rrmm.mr.CallbackMemoryResource(sim.allocate, sim.deallocate)


KEEPS: dict[str, Callable[[], Any]] = {
    "pool(system)": lambda: _pool(rrmm.mr.SystemMemoryResource()),
    "pool(simulated)": lambda: _pool(rrmm.mr.SimulatedMemoryResource(1 << 34)),
    "binning(pool(system))": lambda: rrmm.mr.BinningMemoryResource(
        _pool(rrmm.mr.SystemMemoryResource()), 18, 22
    ),
    "statistics(pool(system))": lambda: rrmm.mr.StatisticsResourceAdaptor(
        _pool(rrmm.mr.SystemMemoryResource())
    ),
    "arena(system)": lambda: rrmm.mr.ArenaMemoryResource(
        rrmm.mr.SystemMemoryResource(), arena_size=64 * MIB
    ),
}

RELEASES: dict[str, Callable[[], Any]] = {
    "system": rrmm.mr.SystemMemoryResource,
    "pool(callback)": lambda: _pool(_callback_source()),
}


@pytest.mark.parametrize("name", list(KEEPS))
def test_suballocators_keep_the_gil(name: str) -> None:
    assert not _releases_gil(KEEPS[name]()), f"{name} released the GIL on a round trip"


@pytest.mark.parametrize("name", list(RELEASES))
def test_blocking_sources_and_python_below_release_it(name: str) -> None:
    assert _releases_gil(RELEASES[name]()), f"{name} kept the GIL"


def test_a_bin_added_later_reaches_the_objects_built_over_it() -> None:
    """A bin that runs Python, added to a binning resource after an adaptor was built over it:
    the adaptor's object (built when nothing below ran Python) now releases the GIL (the
    link's calls grew; issue 36)."""
    binning = rrmm.mr.BinningMemoryResource(_pool(rrmm.mr.SystemMemoryResource()))
    over = rrmm.mr.StatisticsResourceAdaptor(binning)
    assert not _releases_gil(over), "bookkeeping only, before the bin"
    binning.add_bin(MIB, _callback_source())
    assert _releases_gil(over), "a bin that runs Python below the adaptor"
    assert _releases_gil(binning)
