"""GPU tests of managed memory without the penalty (issue 19), through the Python API: the
documents' managed setup keeps RMM's types and reuses freed ranges, the managed pool may grow
past the device, the fallback serves past a device budget. Managed use stays far below the
free memory. Skipped with a reason where there is no CUDA driver or device."""

from __future__ import annotations

import pytest
import rrmm
from conftest import skip_module_without_gpu
from rrmm import _rrmm, mr

skip_module_without_gpu()

np = pytest.importorskip("numpy")

MiB = 1 << 20


@pytest.fixture(autouse=True)
def fresh_table():
    _rrmm._clear_per_device_resources()
    yield
    _rrmm._clear_per_device_resources()


def test_the_documents_managed_setup_is_a_managed_resource_that_reuses_what_is_freed():
    rrmm.reinitialize(managed_memory=True, pool_allocator=False)
    top = mr.get_current_device_resource()
    assert type(top) is mr.ManagedMemoryResource
    assert top.cache_limit == mr.available_device_memory()[1] // 4
    a = rrmm.DeviceBuffer(size=8 * MiB)
    ptr = a.ptr
    del a
    assert top.cached_bytes() == 8 * MiB
    b = rrmm.DeviceBuffer(size=8 * MiB - 100)  # the same size class
    assert b.ptr == ptr
    data = np.arange(1000, dtype=np.uint8)
    c = rrmm.DeviceBuffer.to_device(data.tobytes())
    assert np.frombuffer(c.tobytes(), dtype=np.uint8).tolist() == data.tolist()
    del b, c
    assert top.release() >= 8 * MiB
    assert top.cached_bytes() == 0


def test_rmm_behaviour_when_asked_for_it():
    plain = mr.ManagedMemoryResource(cache_limit=0, placement=False)
    assert (plain.cache_limit, plain.placement) == (0, False)
    p = plain.allocate(MiB)
    plain.deallocate(p, MiB)
    assert plain.cached_bytes() == 0 and plain.held_bytes() == 0
    with pytest.raises(RuntimeError, match="did not allocate"):
        plain.deallocate(p, MiB)  # a double free is refused, never reaches the driver


def _host_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))


def test_the_managed_pool_may_grow_past_the_device_by_what_the_host_can_hold():
    rrmm.reinitialize(managed_memory=True, pool_allocator=True, initial_pool_size="64MiB")
    pool = mr.get_current_device_resource()
    assert isinstance(pool, mr.PoolMemoryResource)
    assert isinstance(pool.upstream_mr, mr.ManagedMemoryResource)
    total = mr.available_device_memory()[1]
    beyond = pool.maximum_pool_size() - total
    # 15/16 of the host's available memory when the pool was made (it moves a little since),
    # capped by the cgroup's room where a limit is set: more than nothing, never more.
    assert 0 < beyond < _host_available() * 15 // 16 + _host_available() // 16
    assert pool.upstream_mr.cache_limit == 0  # the pool keeps; its upstream does not


def test_the_fallback_serves_past_a_device_budget_from_managed_memory():
    device = mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), 64 * MiB)
    fb = mr.FallbackResourceAdaptor(device)
    assert isinstance(fb.alternate_mr, mr.ManagedMemoryResource)
    bufs = [rrmm.DeviceBuffer.to_device(bytes([i]) * (24 * MiB), mr=fb) for i in range(5)]
    counts = fb.counts()
    assert (counts["upstream_allocations"], counts["alternate_allocations"]) == (2, 3)
    for i, b in enumerate(bufs):
        assert b.tobytes()[:: 4 * MiB] == bytes([i]) * 6
    del bufs, b
    assert fb.counts()["alternate_bytes"] == 0


def _last_prefetch_location(buf: rrmm.DeviceBuffer) -> int:
    """CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION of the buffer (RMM's test reads it so)."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    loc = ctypes.c_int(99)
    rc = cu.cuMemRangeGetAttribute(ctypes.byref(loc), ctypes.c_size_t(4), 4,
                                   ctypes.c_uint64(buf.ptr), ctypes.c_size_t(buf.size))
    assert rc == 0, f"cuMemRangeGetAttribute: {rc}"
    return loc.value


@pytest.mark.parametrize("pool", [False, True])
def test_a_fresh_small_managed_buffer_has_no_prefetch_location_until_prefetched(pool):
    """RMM's test_rmm_device_buffer_prefetch[True-*] (issue 29): placement leaves small ranges
    (and a pool's chunks) alone, so a fresh 256-byte buffer has no prefetch location; after
    ``prefetch()`` it is on the current device."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    dev, value = ctypes.c_int(), ctypes.c_int()
    cu.cuInit(0)
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    cu.cuDeviceGetAttribute(ctypes.byref(value), 89, dev)  # CONCURRENT_MANAGED_ACCESS
    if not value.value:
        pytest.skip("this device cannot prefetch managed memory")
    rrmm.reinitialize(pool_allocator=pool, managed_memory=True)
    db = rrmm.DeviceBuffer.to_device(np.zeros(256, dtype="u1"))
    assert _last_prefetch_location(db) == -2
    db.prefetch()
    rrmm.pylibrmm.stream.DEFAULT_STREAM.synchronize()
    assert _last_prefetch_location(db) == 0


def test_the_managed_pool_places_the_blocks_it_hands_out():
    """A block of 64 MiB from the managed pool is prefetched to the device when handed out
    (the pool's chunk itself is not), and counted once."""
    rrmm.reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size="256MiB")
    pool = mr.get_current_device_resource()
    managed = pool.upstream_mr
    before = managed.placed_bytes()
    a = rrmm.DeviceBuffer(size=64 * MiB)
    after = managed.placed_bytes()
    assert after[0] - before[0] >= 62 * MiB, (before, after)
    assert after[1] == before[1]
    del a
    b = rrmm.DeviceBuffer(size=64 * MiB)
    assert managed.placed_bytes() == after
    del b
