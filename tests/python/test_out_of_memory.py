"""Out-of-memory errors explain themselves (RMM's text first, then the request, the chain with
what each resource holds, the memory below it and one hint), and rrmm.memory_summary() prints
the same table; the resource keeps working after. On simulated memory, so it runs anywhere."""

from __future__ import annotations

import pytest
import rrmm
from rrmm import _rrmm, mr

MiB = 1 << 20


def oom_text(fn) -> str:
    with pytest.raises(MemoryError) as info:
        fn()
    text = str(info.value)
    assert text.startswith("std::bad_alloc: out_of_memory"), text
    assert "resource chain (top first)" in text, text
    return text


def test_a_pool_at_its_maximum():
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(1024 * MiB),
                                 initial_pool_size=256 * MiB, maximum_pool_size=512 * MiB)
    held = pool.allocate(200 * MiB)
    text = oom_text(lambda: pool.allocate(300 * MiB))
    assert "request: 300.00 MiB (314572800 bytes)" in text
    assert "pool: held 256.00 MiB, in use 200.00 MiB, free 56.00 MiB" in text
    assert "hint: the pool reached its maximum size" in text and "maximum_pool_size" in text
    pool.deallocate(held, 200 * MiB)
    pool.deallocate(pool.allocate(MiB), MiB)  # still works


def test_a_request_above_the_maximum_says_so():
    # Issue 29: 600 MiB on a 512 MiB maximum was told the pool "reached its maximum size".
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(1024 * MiB),
                                 initial_pool_size=256 * MiB, maximum_pool_size=512 * MiB)
    text = oom_text(lambda: pool.allocate(600 * MiB))
    assert "request: 600.00 MiB (629145600 bytes)" in text
    assert "larger than the pool's maximum" in text
    assert "hint: the request is larger than the pool's maximum size" in text
    assert "reached its maximum" not in text
    pool.deallocate(pool.allocate(MiB), MiB)  # still works


def test_a_fragmented_pool_through_a_device_buffer():
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(64 * MiB),
                                 initial_pool_size=64 * MiB, maximum_pool_size=64 * MiB)
    stats = mr.StatisticsResourceAdaptor(pool)
    ptrs = [stats.allocate(8 * MiB) for _ in range(8)]
    for p in ptrs[::2]:
        stats.deallocate(p, 8 * MiB)
    text = oom_text(lambda: rrmm.DeviceBuffer(size=16 * MiB, mr=stats))
    assert "statistics" in text.split("resource chain")[1]
    assert "largest free block 8.00 MiB" in text and "fragmentation 0.75" in text
    assert "hint: fragmented" in text and "expandable" in text
    for p in ptrs[1::2]:
        stats.deallocate(p, 8 * MiB)
    rrmm.DeviceBuffer(size=16 * MiB, mr=stats)  # whole again


def test_a_full_device():
    device = mr.SimulatedMemoryResource(64 * MiB)
    held = device.allocate(60 * MiB)
    text = oom_text(lambda: device.allocate(16 * MiB))
    assert "hint: the memory below is full" in text and "free of 64.00 MiB" in text
    device.deallocate(held, 60 * MiB)


def test_memory_summary_prints_the_chain():
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(64 * MiB),
                                 initial_pool_size=32 * MiB)
    before = mr.get_per_device_resource(0) if _rrmm.has_per_device_resource(0) else None
    mr.set_per_device_resource(0, mr.StatisticsResourceAdaptor(pool))
    try:
        p = pool.allocate(4 * MiB)
        text = rrmm.memory_summary(0)
        lines = text.splitlines()
        assert lines[0] == "rrmm memory summary, device 0"
        assert lines[2].strip() == "statistics"
        assert lines[3].strip().startswith("pool: held 32.00 MiB, in use 4.00 MiB")
        assert "memory below it: 32.00 MiB free of 64.00 MiB" in lines[4]
        pool.deallocate(p, 4 * MiB)
    finally:
        if before is not None:
            mr.set_per_device_resource(0, before)
        else:
            _rrmm._clear_per_device_resources()
