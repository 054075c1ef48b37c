"""rrmm.mr.ExpandableMemoryResource, rrmm.statistics.memory_stats and rrmm.memory_snapshot on
simulated virtual memory (CPU), plus GPU checks that skip without a device."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import rrmm
from conftest import gpu_available, gpu_skip_reason
from rrmm import _rrmm

GIB = 1 << 30
MIB = 1 << 20
PAGE = 2 * MIB


@pytest.fixture
def expandable() -> Iterator[rrmm.mr.ExpandableMemoryResource]:
    """A 32 GiB simulated expandable pool set as the current device's resource."""
    mr = rrmm.mr.ExpandableMemoryResource(simulated_capacity="32GiB")
    rrmm.mr.set_current_device_resource(mr)
    yield mr
    _rrmm._clear_per_device_resources()


def test_the_growth_log_fits_where_the_pool_fails(expandable: Any) -> None:
    a = expandable.allocate(12 * GIB)
    b = expandable.allocate(8 * GIB)
    expandable.deallocate(a, 12 * GIB)
    c = expandable.allocate(20 * GIB)
    assert expandable.mapped_bytes() == 28 * GIB
    expandable.deallocate(b, 8 * GIB)
    expandable.deallocate(c, 20 * GIB)
    assert expandable.trim() == 28 * GIB
    assert expandable.mapped_bytes() == 0

    pool = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource("32GiB"))
    a = pool.allocate(12 * GIB)
    pool.allocate(8 * GIB)
    pool.deallocate(a, 12 * GIB)
    with pytest.raises(MemoryError):
        pool.allocate(20 * GIB)


def test_figures_and_trim(expandable: Any) -> None:
    assert expandable.reserved_bytes() == 4 * 32 * GIB
    assert expandable.page_size() == PAGE
    assert expandable.maximum_pool_size() is None
    assert expandable.release_threshold() is None
    a = expandable.allocate(3 * PAGE)
    b = expandable.allocate(PAGE)
    expandable.deallocate(a, 3 * PAGE)
    # b's growth step mapped half of what was mapped (2 pages): b and a fresh page after it.
    assert expandable.pool_size() == 5 * PAGE
    assert expandable.free_bytes() == 4 * PAGE
    assert expandable.largest_free_block() == 3 * PAGE
    assert expandable.free_block_count() == 2
    assert expandable.trim(PAGE * 2) == 3 * PAGE
    assert expandable.mapped_bytes() == 2 * PAGE
    assert expandable.release() == PAGE
    assert expandable.mapped_bytes() == PAGE
    expandable.deallocate(b, PAGE)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError):
        rrmm.mr.ExpandableMemoryResource(simulated_capacity="1GiB", page_size=100)
    with pytest.raises((ValueError, RuntimeError)):
        rrmm.mr.ExpandableMemoryResource(simulated_capacity="1GiB", initial_pool_size=100)
    mr = rrmm.mr.ExpandableMemoryResource(
        simulated_capacity="1GiB", maximum_pool_size="4MiB", release_threshold=0
    )
    assert mr.maximum_pool_size() == 4 * MIB
    with pytest.raises(MemoryError):
        mr.allocate(8 * MIB)
    p = mr.allocate(MIB)
    mr.deallocate(p, MIB)
    assert mr.mapped_bytes() == 0, "a release threshold of 0 unmaps at every free"


def test_device_buffers_trim_on_free_with_a_release_threshold() -> None:
    mr = rrmm.mr.ExpandableMemoryResource(simulated_capacity="1GiB", release_threshold=0)
    rrmm.mr.set_current_device_resource(mr)
    try:
        for size in (1 << 10, 3 * PAGE):
            buf = rrmm.DeviceBuffer(size=size)
            assert mr.mapped_bytes() >= size
            del buf
            assert mr.mapped_bytes() == 0, size
    finally:
        _rrmm._clear_per_device_resources()


def test_reinitialize_expandable_rejects_managed_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="managed"):
        rrmm.reinitialize(pool_allocator="expandable", managed_memory=True)
    with pytest.raises(ValueError, match="expandable"):
        rrmm.reinitialize(pool_allocator="bogus")  # the message lists the kinds


def test_memory_stats_use_pytorchs_keys(expandable: Any) -> None:
    rrmm.statistics.reset_peak_memory_stats()
    a = rrmm.DeviceBuffer(size=1000)
    b = rrmm.DeviceBuffer(size=PAGE)
    del a
    stats = rrmm.statistics.memory_stats()
    assert stats["allocation.all.current"] == 1
    assert stats["allocation.all.peak"] == 2
    assert stats["allocated_bytes.all.current"] == PAGE
    assert stats["allocated_bytes.all.allocated"] == PAGE + 1024
    assert stats["allocated_bytes.all.freed"] == 1024
    assert stats["active_bytes.all.current"] == PAGE
    assert stats["reserved_bytes.all.current"] == 2 * PAGE
    assert stats["segment.all.current"] == 1
    assert stats["inactive_split_bytes.all.current"] == PAGE
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"):
        assert key in stats
    assert all(isinstance(v, int) for v in stats.values())
    rrmm.statistics.reset_peak_memory_stats()
    assert rrmm.statistics.memory_stats()["allocation.all.peak"] == 1
    del b


def test_memory_stats_of_a_pool_through_an_adaptor() -> None:
    pool = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource("1GiB"), "4MiB")
    rrmm.mr.set_current_device_resource(rrmm.mr.StatisticsResourceAdaptor(pool))
    try:
        p = pool.allocate(MIB)
        stats = rrmm.statistics.memory_stats(0)
        assert stats["allocated_bytes.all.current"] == MIB
        assert stats["reserved_bytes.all.current"] == 4 * MIB
        assert stats["segment.all.current"] == 1
        pool.deallocate(p, MIB)
    finally:
        _rrmm._clear_per_device_resources()


def test_memory_stats_without_a_pool_is_empty() -> None:
    rrmm.mr.set_current_device_resource(rrmm.mr.SimulatedMemoryResource("1GiB"))
    try:
        assert rrmm.statistics.memory_stats() == {}
        assert rrmm.memory_snapshot()["segments"] == []
    finally:
        _rrmm._clear_per_device_resources()


def _segsum_like(data: dict[str, Any]) -> tuple[int, int, int]:
    """What ``torch.cuda._memory_viz.segsum`` reads from a snapshot, read the same way (fields,
    block order, and its assertion that blocks cover each segment): (reserved, allocated, free)."""
    reserved = allocated = free = 0
    for seg in sorted(data["segments"], key=lambda s: (s["total_size"], s["address"])):
        reserved += seg["total_size"]
        offset = 0
        for b in seg["blocks"]:
            assert b["address"] == seg["address"] + offset
            if b["state"] == "active_allocated":
                frames, size = b["frames"], b["requested_size"]
                assert frames == []
                allocated += size
                free += b["size"] - size
            else:
                assert b["state"] == "inactive"
                free += b["size"]
            offset += b["size"]
        assert offset == seg["total_size"]
        assert isinstance(seg["stream"], int)
        assert seg["segment_type"] in ("large", "small")
        assert seg["device"] == 0
        assert seg["allocated_size"] == sum(
            b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"
        )
    assert free + allocated == reserved
    return reserved, allocated, free


def test_snapshot_has_the_layout_pytorchs_tools_read(expandable: Any) -> None:
    a = expandable.allocate(3 * PAGE)
    b = expandable.allocate(PAGE)
    c = expandable.allocate(PAGE + 512)
    expandable.deallocate(b, PAGE)
    expandable.trim()
    snap = rrmm.memory_snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    assert snap["device_traces"] == [[] for _ in snap["device_traces"]]
    assert len(snap["segments"]) == 2, "trim cut the mapped range in two"
    assert all(s["is_expandable"] for s in snap["segments"])
    reserved, allocated, _ = _segsum_like(snap)
    assert reserved == expandable.mapped_bytes()
    assert allocated == 3 * PAGE + PAGE + 512
    # It pickles, as torch.cuda.memory._dump_snapshot writes it.
    buf = io.BytesIO()
    pickle.dump(snap, buf)
    assert pickle.loads(buf.getvalue()) == snap
    expandable.deallocate(a, 3 * PAGE)
    expandable.deallocate(c, PAGE + 512)


def test_snapshot_of_a_pool(system_mr: Any) -> None:
    pool = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource("1GiB"), "1MiB")
    rrmm.mr.set_current_device_resource(pool)
    p = pool.allocate(300)
    q = pool.allocate(2 * MIB)
    snap = rrmm.memory_snapshot(0)
    reserved, allocated, _ = _segsum_like(snap)
    assert reserved == pool.pool_size()
    assert allocated == 512 + 2 * MIB
    assert not any(s["is_expandable"] for s in snap["segments"])
    pool.deallocate(p, 300)
    pool.deallocate(q, 2 * MIB)


@pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
def test_gpu_trim_returns_memory_the_driver_sees() -> None:
    mr = rrmm.mr.ExpandableMemoryResource(0)
    free_before, _ = _rrmm.device_memory_info(0)
    p = mr.allocate(1 * GIB)
    mr.deallocate(p, 1 * GIB)
    assert mr.mapped_bytes() >= GIB
    free_mapped, _ = _rrmm.device_memory_info(0)
    assert free_mapped <= free_before - GIB + 64 * MIB
    assert mr.trim() >= GIB
    free_after, _ = _rrmm.device_memory_info(0)
    assert free_after >= free_before - 64 * MIB


@pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
def test_gpu_device_buffers_round_trip_across_growth_and_trim() -> None:
    rrmm.reinitialize(pool_allocator="expandable")
    try:
        mr = rrmm.mr.get_current_device_resource()
        assert isinstance(mr, rrmm.mr.ExpandableMemoryResource)
        bufs = [rrmm.DeviceBuffer.to_device(bytes([i]) * (3 * MIB + i)) for i in range(8)]
        del bufs[::2]
        mr.trim()
        more = [rrmm.DeviceBuffer.to_device(bytes([100 + i]) * (5 * MIB)) for i in range(4)]
        for i, buf in zip(range(1, 8, 2), bufs):
            assert buf.tobytes() == bytes([i]) * (3 * MIB + i)
        for i, buf in enumerate(more):
            assert buf.tobytes() == bytes([100 + i]) * (5 * MIB)
        snap = rrmm.memory_snapshot()
        _segsum_like(snap)
    finally:
        rrmm.reinitialize()


@pytest.mark.skipif(gpu_available(), reason="checks the error without a CUDA device")
def test_without_a_device_the_error_is_clear() -> None:
    with pytest.raises(RuntimeError, match="(?i)cuda|driver|device"):
        rrmm.mr.ExpandableMemoryResource()
