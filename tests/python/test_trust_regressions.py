"""Issue 18's reproducers, one test each (each failed at 745cda1: crash, hang, corruption or an
unclear error); the generative tests (test_api_state_machine.py, test_cli_fuzz.py and
tests/fuzz_trace.rs) are the first line, these keep what they and the probe found."""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from typing import Any

import numpy as np
import pytest
import rrmm
from rrmm import mr

MiB = 1 << 20


def test_a_binning_resource_cannot_be_its_own_bin(child: Any) -> None:
    """Was SIGSEGV (unbounded recursion)."""
    child(
        """
b = mr.BinningMemoryResource(mr.SimulatedMemoryResource("1GiB"))
expect(ValueError, "reaches this binning resource", lambda: b.add_bin(1024, b))
a = mr.BinningMemoryResource(mr.SimulatedMemoryResource("1GiB"))
c = mr.BinningMemoryResource(mr.SimulatedMemoryResource("1GiB"))
a.add_bin(1024, c)
expect(ValueError, "reaches this binning resource", lambda: c.add_bin(1024, a))
s = mr.StatisticsResourceAdaptor(a)
expect(ValueError, "reaches this binning resource", lambda: a.add_bin(4096, s))
p = b.allocate(100); b.deallocate(p, 100)
p = a.allocate(100); a.deallocate(p, 100)
print("CHILD OK")
"""
    )


def test_a_callback_cycle_through_bins_is_bounded(child: Any) -> None:
    """A bin whose callback allocates from the binning resource it serves: an error after a
    bounded nesting, not a stack overflow."""
    child(
        """
b = mr.BinningMemoryResource(mr.SimulatedMemoryResource("1GiB"))
cb = mr.CallbackMemoryResource(lambda n, s: b.allocate(n, s), lambda p, n, s: b.deallocate(p, n, s))
b.add_bin(1024, cb)
expect(RuntimeError, "nested", lambda: b.allocate(100))
p = b.allocate(4096); b.deallocate(p, 4096)
print("CHILD OK")
"""
    )


def test_deep_stacks_are_refused_and_dropped(child: Any) -> None:
    """~40,000 stacked adaptors crashed on allocate and on drop."""
    child(
        """
m = mr.SimulatedMemoryResource("1GiB")
layers = 0
try:
    for _ in range(40000):
        m = mr.StatisticsResourceAdaptor(m)
        layers += 1
except ValueError as e:
    assert "at most 256" in str(e), e
assert layers == 255, layers
p = m.allocate(100); m.deallocate(p, 100)
del m
print("CHILD OK")
"""
    )


def test_a_null_free_does_not_poison_statistics() -> None:
    st = mr.StatisticsResourceAdaptor(mr.SimulatedMemoryResource("1GiB"))
    st.deallocate(0, 1000)
    a = st.allocate(1000)
    st.deallocate(a, 1000)
    c = st.allocation_counts
    assert (c.current_bytes, c.current_count, c.total_count) == (0, 0, 1)


def test_allocations_before_add_bin_can_be_freed() -> None:
    b = mr.BinningMemoryResource(mr.SimulatedMemoryResource("1GiB"))
    a = b.allocate(300)
    b.add_bin(512)
    b.deallocate(a, 300)
    c = b.allocate(300)  # now from the bin
    b.add_bin(384)  # a smaller bin now catches 300-byte requests
    b.deallocate(c, 300)
    d = b.allocate(300)
    b.deallocate(d, 300)


def test_a_huge_simulated_device_leaves_host_copies_alone() -> None:
    mr.set_current_device_resource(mr.SystemMemoryResource())
    data = np.arange(4 << 20, dtype=np.uint32).view(np.uint8)[: 4 << 20]
    sim = mr.SimulatedMemoryResource("141GB")
    buf = rrmm.to_device(data)
    assert buf.tobytes() == data.tobytes()
    p = sim.allocate(256)
    with pytest.raises(RuntimeError, match="simulated"):
        rrmm._rrmm.copy_ptr_to_host(p, bytearray(16))
    sim.deallocate(p, 256)


def test_an_upstream_that_allocates_from_its_own_pool_is_an_error(child: Any) -> None:
    """Was a deadlock for ever."""
    child(
        """
s = mr.SimulatedMemoryResource("1GiB")
box = {}
def alloc(n, stream):
    if "pool" in box:
        box["pool"].allocate(256)
    return s.allocate(n, stream)
cb = mr.CallbackMemoryResource(alloc, lambda p, n, stream: s.deallocate(p, n, stream))
pool = mr.PoolMemoryResource(cb, initial_pool_size=0)
box["pool"] = pool
expect(RuntimeError, "called again from inside its own upstream call", lambda: pool.allocate(1 << 20))
def stats(n, stream):
    box["pool"].pool_size()
    return s.allocate(n, stream)
cb2 = mr.CallbackMemoryResource(stats, lambda p, n, stream: s.deallocate(p, n, stream))
pool2 = mr.PoolMemoryResource(cb2, initial_pool_size=0)
box["pool"] = pool2
expect(RuntimeError, "cannot be read from inside its own upstream call", lambda: pool2.allocate(1 << 20))
del box["pool"]
p = pool.allocate(1 << 20); pool.deallocate(p, 1 << 20)
print("CHILD OK")
""",
        timeout=30,
    )


def test_a_null_or_wrapping_upstream_block_is_refused() -> None:
    sim = mr.SimulatedMemoryResource("1GiB")
    null = mr.CallbackMemoryResource(lambda n, s: 0, lambda p, n, s: None)
    with pytest.raises(MemoryError, match="null pointer"):
        null.allocate(100)
    wrap = mr.CallbackMemoryResource(lambda n, s: (1 << 64) - 256, lambda p, n, s: None)
    with pytest.raises(RuntimeError, match="past the end"):
        wrap.allocate(4096)
    with pytest.raises(RuntimeError, match="past the end"):
        mr.PoolMemoryResource(wrap, initial_pool_size=1 << 20)
    p = sim.allocate(256)
    sim.deallocate(p, 256)


def test_saturated_counters_keep_accepting_correct_frees() -> None:
    # Distinct blocks that do not overlap (the callback resource refuses overlapping blocks).
    addresses = iter(range(1 << 20, 1 << 64, 1 << 62))
    cb = mr.CallbackMemoryResource(lambda n, s: next(addresses), lambda p, n, s: None)
    st = mr.StatisticsResourceAdaptor(cb)
    huge = 1 << 62
    ptrs = [st.allocate(huge) for _ in range(3)]
    for p in ptrs:
        st.deallocate(p, huge)


_RESOURCES = {
    "simulated": lambda: mr.SimulatedMemoryResource("64MiB"),
    "system": lambda: mr.SystemMemoryResource(),
    "pool": lambda: mr.PoolMemoryResource(mr.SimulatedMemoryResource("64MiB"), 1 << 20),
    "fixed_size": lambda: mr.FixedSizeMemoryResource(mr.SimulatedMemoryResource("64MiB"), 4096),
    "binning": lambda: mr.BinningMemoryResource(mr.SimulatedMemoryResource("64MiB"), 8, 12),
    "arena": lambda: mr.ArenaMemoryResource(mr.SimulatedMemoryResource("64MiB"), 4 << 20),
    "expandable": lambda: mr.ExpandableMemoryResource(simulated_capacity="64MiB"),
    "statistics": lambda: mr.StatisticsResourceAdaptor(mr.SimulatedMemoryResource("64MiB")),
    "tracking": lambda: mr.TrackingResourceAdaptor(mr.SimulatedMemoryResource("64MiB")),
    "limiting": lambda: mr.LimitingResourceAdaptor(mr.SimulatedMemoryResource("64MiB"), 1 << 20),
    "aligned": lambda: mr.AlignedResourceAdaptor(mr.SimulatedMemoryResource("64MiB"), 4096),
    "prefetch": lambda: mr.PrefetchResourceAdaptor(mr.SimulatedMemoryResource("64MiB")),
}


@pytest.mark.parametrize("make", list(_RESOURCES.values()), ids=list(_RESOURCES))
@pytest.mark.parametrize("nbytes", [0, 1, 1000])
def test_a_null_free_is_a_no_op_everywhere(make: Any, nbytes: int) -> None:
    """One rule for null frees (RMM's): nothing happens, whatever the size."""
    r = make()
    r.deallocate(0, nbytes)
    p = r.allocate(1000)
    r.deallocate(p, 1000)


def test_reference_cycles_through_callbacks_are_collected() -> None:
    class Sentinel:
        pass

    def make() -> weakref.ref[Sentinel]:
        s = Sentinel()
        sim = mr.SimulatedMemoryResource("1GiB")
        holder: dict[str, Any] = {}

        def alloc(n: int, stream: Any) -> int:
            assert s is not None and holder is not None
            return sim.allocate(n, stream)

        cb = mr.CallbackMemoryResource(alloc, lambda p, n, stream: sim.deallocate(p, n, stream))
        holder["top"] = mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(cb, 1 << 20))
        holder["fc"] = mr.FailureCallbackResourceAdaptor(sim, lambda n: bool(holder) and False)
        holder["buf"] = rrmm.DeviceBuffer(size=16, mr=holder["fc"])
        return weakref.ref(s)

    ref = make()
    gc.collect()
    assert ref() is None, "the cycle through the callbacks was not collected"


def test_a_failed_free_at_drop_is_reported_not_swallowed() -> None:
    sim = mr.SimulatedMemoryResource("1GiB")

    def dealloc(p: int, n: int, stream: Any) -> None:
        raise KeyError("free failed")

    cb = mr.CallbackMemoryResource(lambda n, s: sim.allocate(n, s), dealloc)
    seen: list[Any] = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        buf = rrmm.DeviceBuffer(size=64, mr=cb)
        ptr = buf.ptr
        del buf
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert seen and "free failed" in str(seen[0].exc_value)
    # The report says where ("Exception ignored in: ..."), not None.
    assert seen[0].object == f"the free of rrmm.DeviceBuffer at {ptr:#x} (64 bytes)"


def test_array_interface_byte_counts_cannot_wrap() -> None:
    class Cai:
        __cuda_array_interface__ = {  # noqa: RUF012
            "data": (1 << 20, False), "shape": (1 << 62,), "strides": None, "typestr": "<f8",
            "version": 3,
        }

    buf = rrmm.DeviceBuffer(size=16, mr=mr.SystemMemoryResource())
    with pytest.raises(ValueError, match="more bytes than an address space holds"):
        buf.copy_from_device(Cai())


def test_resize_and_reads_from_threads_never_show_a_borrow_error() -> None:
    buf = rrmm.DeviceBuffer(size=64, mr=mr.SystemMemoryResource())
    errors: list[BaseException] = []

    def resize(t: int) -> None:
        try:
            for i in range(200):
                buf.resize(64 + (i + t) % 7 * 64)
                buf.tobytes()
                _ = buf.size, buf.capacity(), buf.ptr
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=resize, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_options_that_would_fail_every_allocation_are_refused() -> None:
    with pytest.raises(ValueError, match="more than the capacity"):
        mr.ExpandableMemoryResource(simulated_capacity="1GiB", page_size=1 << 40)
    with pytest.raises(ValueError, match="less than one page"):
        mr.ExpandableMemoryResource(simulated_capacity="1GiB", maximum_pool_size=256)


def test_reinitialize_checks_devices_before_forgetting_anything() -> None:
    keep = mr.SystemMemoryResource()
    mr.set_current_device_resource(keep)
    for bad in ([-1], ["x"], [0, -5]):
        with pytest.raises((ValueError, TypeError)):
            rrmm.reinitialize(devices=bad)
        assert mr.get_current_device_resource() is keep


def test_a_log_without_newlines_is_refused_quickly(tmp_path: Any) -> None:
    path = tmp_path / "zeros.csv"
    path.write_bytes(b"\0" * (8 << 20))
    from rrmm.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        code = main(["replay", str(path), "--simulate", "1GiB"])
        raise SystemExit(code)
    assert exit_info.value.code in (1, 2)


def test_dask_options_are_checked_at_construction() -> None:
    pytest.importorskip("distributed")  # rrmm.dask raises ImportError without it
    dask_setup = pytest.importorskip("rrmm.dask")
    with pytest.raises(ValueError, match="exceeds the maximum"):
        dask_setup.RRMMSetup(initial_pool_size="2GiB", maximum_pool_size="1GiB")
    with pytest.raises(ValueError, match="exceeds the maximum"):
        dask_setup.RRMMSetup(initial_pool_size=0.8, maximum_pool_size=0.5)
    with pytest.raises(TypeError):
        dask_setup.RRMMSetup(managed_memory="yes")


def test_a_zero_byte_buffer_through_an_adaptor_leaves_statistics_at_zero() -> None:
    # Found by the long run of the state machine: a null free stopped at the limiting adaptor,
    # so the statistics adaptor below it kept counting the zero-byte allocation.
    sim = mr.SimulatedMemoryResource(4 << 20)
    stats = mr.StatisticsResourceAdaptor(sim)
    for top in (mr.LimitingResourceAdaptor(stats, 0), mr.TrackingResourceAdaptor(stats),
                mr.AlignedResourceAdaptor(stats, 512), mr.StatisticsResourceAdaptor(stats)):
        buf = rrmm.DeviceBuffer.to_device(b"", mr=top)
        del buf
        counts = stats.allocation_counts
        assert (counts.current_bytes, counts.current_count) == (0, 0), (top, counts)
