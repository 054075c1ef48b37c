"""The fallback adaptor (device first, then an alternate instead of MemoryError) and the stack
kinds of issue 19 (managed, managed_pool, fallback), on simulated memory: no GPU needed."""

from __future__ import annotations

import pytest
from rrmm import _stack, mr

MiB = 1 << 20


def test_fallback_serves_from_the_alternate_when_the_upstream_is_full_and_frees_each_back():
    device = mr.SimulatedMemoryResource("8MiB")
    host = mr.SimulatedMemoryResource(0, host_memory="64MiB")
    fb = mr.FallbackResourceAdaptor(device, host)
    assert fb.upstream_mr is device and fb.alternate_mr is host
    a = fb.allocate(6 * MiB)
    b = fb.allocate(4 * MiB)  # 10 MiB > 8: the alternate
    c = fb.allocate(1 * MiB)  # fits the device again
    assert (device.bytes_in_use(), host.bytes_in_use()) == (7 * MiB, 4 * MiB)
    counts = fb.counts()
    assert counts == {
        "upstream_allocations": 2, "upstream_bytes": 7 * MiB,
        "alternate_allocations": 1, "alternate_bytes": 4 * MiB,
        "alternate_peak_bytes": 4 * MiB, "fallbacks": 1, "failures": 0,
    }
    with pytest.raises(RuntimeError, match="fallback: deallocate of"):
        fb.deallocate(b, 1 * MiB)  # the alternate's block with another size
    for ptr, size in ((b, 4 * MiB), (a, 6 * MiB), (c, 1 * MiB)):
        fb.deallocate(ptr, size)
    assert (device.bytes_in_use(), host.bytes_in_use()) == (0, 0)
    with pytest.raises(MemoryError, match="every tier is out of memory"):
        fb.allocate(1 << 40)
    assert fb.counts()["failures"] == 1
    assert fb.allocate(0) == 0


def test_fallback_arguments_are_checked():
    device = mr.SimulatedMemoryResource("8MiB")
    with pytest.raises(TypeError, match="DeviceMemoryResource"):
        mr.FallbackResourceAdaptor(device, "managed")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mr.FallbackResourceAdaptor(None, device)
    from rrmm import _rrmm
    if _rrmm.device_count() == 0:
        # The default alternate is managed memory, which needs a GPU.
        with pytest.raises(RuntimeError, match="no CUDA driver"):
            mr.FallbackResourceAdaptor(device)


def test_the_fallback_kind_replays_past_the_device_with_its_bytes_beyond_it():
    top = _stack.build("fallback", simulate=8 * MiB, initial_pool_size=4 * MiB)
    assert isinstance(top, mr.FallbackResourceAdaptor)
    assert isinstance(top.upstream_mr, mr.PoolMemoryResource)
    assert top.alternate_mr.host_memory > 0
    ptrs = [top.allocate(3 * MiB) for _ in range(4)]  # 12 MiB on an 8 MiB device
    assert top.counts()["fallbacks"] >= 1
    for p in ptrs:
        top.deallocate(p, 3 * MiB)
    assert top.counts()["alternate_bytes"] == 0


def test_the_managed_pool_kind_may_grow_to_twice_the_device_by_default():
    pool = _stack.build("managed_pool", simulate=8 * MiB)
    assert isinstance(pool, mr.PoolMemoryResource)
    assert pool.maximum_pool_size() == 16 * MiB
    device = pool.upstream_mr
    assert isinstance(device, mr.SimulatedMemoryResource) and device.host_memory > 0
    ptrs = [pool.allocate(4 * MiB) for _ in range(3)]  # 12 MiB: past the device
    assert device.beyond_device_bytes()[0] == pool.pool_size() - 8 * MiB > 0
    with pytest.raises(MemoryError):
        pool.allocate(8 * MiB)  # past twice the device
    for p in ptrs:
        pool.deallocate(p, 4 * MiB)
    capped = _stack.build("managed_pool", simulate=8 * MiB, maximum_pool_size=10 * MiB)
    assert capped.maximum_pool_size() == 10 * MiB


def test_release_caches_gives_back_what_is_cached_once():
    # Caches of earlier tests (on a GPU) may hold ranges: the first call drains them all.
    assert mr.release_caches() >= 0
    assert mr.release_caches() == 0
    assert mr.release_caches(3) == 0


def test_the_default_alternate_is_rmms_managed_memory() -> None:
    """Without an alternate, RMM's default: a ManagedMemoryResource (made from its class by the
    bindings, which never import the Python package back): on a GPU it is the alternate; without
    a driver making it is the clear error of managed memory."""
    from conftest import gpu_available

    if not gpu_available():
        with pytest.raises(RuntimeError, match="driver"):
            mr.FallbackResourceAdaptor(mr.SimulatedMemoryResource("8MiB"))
        return
    fb = mr.FallbackResourceAdaptor(mr.CudaMemoryResource())
    assert type(fb.alternate_mr) is mr.ManagedMemoryResource
