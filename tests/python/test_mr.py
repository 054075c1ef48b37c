"""rrmm.mr on CPU: resources over host and simulated memory, adaptors, byte sizes, errors."""

from __future__ import annotations

import os

import pytest
import rrmm
from rrmm import _rrmm, mr
from rrmm.pylibrmm.stream import DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM

ALL_CLASSES = [
    "DeviceMemoryResource",
    "UpstreamResourceAdaptor",
    "CudaMemoryResource",
    "ManagedMemoryResource",
    "SystemMemoryResource",
    "PinnedHostMemoryResource",
    "SamHeadroomMemoryResource",
    "CudaAsyncMemoryResource",
    "CudaAsyncViewMemoryResource",
    "PoolMemoryResource",
    "FixedSizeMemoryResource",
    "BinningMemoryResource",
    "CallbackMemoryResource",
    "LimitingResourceAdaptor",
    "LoggingResourceAdaptor",
    "StatisticsResourceAdaptor",
    "TrackingResourceAdaptor",
    "FailureCallbackResourceAdaptor",
    "PrefetchResourceAdaptor",
    "SimulatedMemoryResource",
]


@pytest.mark.parametrize("name", ALL_CLASSES)
def test_classes_exist_and_subclass_base(name):
    cls = getattr(mr, name)
    assert issubclass(cls, mr.DeviceMemoryResource)
    assert name in mr.__all__
    assert getattr(rrmm.pylibrmm.memory_resource, name) is cls


def test_adaptor_hierarchy():
    for name in ALL_CLASSES[9:12] + ALL_CLASSES[13:19]:
        assert issubclass(getattr(mr, name), mr.UpstreamResourceAdaptor), name


# ------------------------------------------------------------------ byte sizes


@pytest.mark.parametrize(
    "text,value",
    [
        ("100", 100),
        ("100b", 100),
        ("100B", 100),
        ("2kb", 2000),
        ("2 KB", 2000),
        ("2\tkb", 2000),
        ("2kib", 2048),
        ("2KiB", 2048),
        ("4MiB", 4 << 20),
        ("4mb", 4_000_000),
        ("1GiB", 1 << 30),
        ("1gb", 10**9),
        ("1tib", 1 << 40),
        ("1pb", 10**15),
        ("1.5kib", 1536),
        ("1.", 1),
    ],
)
def test_parse_bytes(text, value):
    assert rrmm.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["2k", "2 k", "kb", ".5kb", "-1", "1e3", "abc", "", "1 xb"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError, match="as a byte specification"):
        rrmm.parse_bytes(text)


def test_parse_bytes_int_passthrough():
    assert rrmm.parse_bytes(12345) == 12345


def test_size_arguments(sim_mr):
    p = mr.PoolMemoryResource(sim_mr, "4MiB", "8MiB")
    assert p.pool_size() == 4 << 20
    assert p.maximum_pool_size() == 8 << 20
    with pytest.raises(TypeError):
        mr.PoolMemoryResource(sim_mr, 1024.0)
    with pytest.raises(OverflowError):
        mr.PoolMemoryResource(sim_mr, -256)
    with pytest.raises(ValueError):
        mr.PoolMemoryResource(sim_mr, "4 megabytes")


# ------------------------------------------------------------------ source resources


def test_allocate_deallocate_simulated(sim_mr):
    p = sim_mr.allocate(1000)
    assert p % 256 == 0 and p != 0
    assert sim_mr.bytes_in_use() == 1024
    sim_mr.deallocate(p, 1000)
    assert sim_mr.bytes_in_use() == 0
    p = sim_mr.allocate(1000, PER_THREAD_DEFAULT_STREAM)
    sim_mr.deallocate(p, 1000, stream=PER_THREAD_DEFAULT_STREAM)
    assert sim_mr.allocate(0) == 0
    assert sim_mr.size == 1 << 30


def test_simulated_managed_memory_spills_past_the_device_and_counts_it():
    mib = 1 << 20
    sim = mr.SimulatedMemoryResource("8MiB", host_memory="4MiB")
    assert (sim.size, sim.host_memory) == (8 * mib, 4 * mib)
    a = sim.allocate(6 * mib)
    b = sim.allocate(4 * mib)  # 10 MiB on an 8 MiB device: 2 beyond
    assert sim.beyond_device_bytes() == (2 * mib, 2 * mib)
    with pytest.raises(MemoryError, match="out_of_memory"):
        sim.allocate(4 * mib)  # 14 MiB: past device and host memory
    sim.deallocate(a, 6 * mib)
    assert sim.beyond_device_bytes() == (0, 2 * mib)
    sim.deallocate(b, 4 * mib)
    assert mr.SimulatedMemoryResource("1MiB").host_memory == 0
    with pytest.raises(ValueError, match="host_memory=36028797018963968 bytes beside a device "
                       "of size=1125899906842624 bytes is more than simulated memory can be"):
        mr.SimulatedMemoryResource(1 << 50, host_memory=1 << 55)
    with pytest.raises(OverflowError):
        mr.SimulatedMemoryResource(1 << 20, host_memory=-1)


def test_allocate_argument_errors(sim_mr):
    with pytest.raises(OverflowError):
        sim_mr.allocate(-1)
    with pytest.raises(TypeError):
        sim_mr.allocate(1.0)
    with pytest.raises(TypeError, match="stream argument cannot be None"):
        sim_mr.allocate(10, None)
    with pytest.raises(MemoryError, match="out_of_memory"):
        sim_mr.allocate(2 << 30)


def test_system_memory_resource_real_bytes():
    m = mr.SystemMemoryResource()
    b = rrmm.DeviceBuffer(size=100, mr=m)
    b.copy_from_host(bytes(range(100)))
    assert b.tobytes() == bytes(range(100))


def test_sam_headroom():
    m = mr.SamHeadroomMemoryResource("1MiB")
    assert m.headroom == 1 << 20
    assert isinstance(m, mr.SystemMemoryResource)
    p = m.allocate(100)
    m.deallocate(p, 100)


@pytest.mark.skipif(_rrmm.driver_available(), reason="checks the no-driver errors")
@pytest.mark.parametrize(
    "make",
    [
        lambda: mr.CudaMemoryResource(),
        lambda: mr.ManagedMemoryResource(),
        lambda: mr.PinnedHostMemoryResource(),
        lambda: mr.CudaAsyncMemoryResource(),
        lambda: mr.CudaAsyncViewMemoryResource(0x1234),
        lambda: mr.get_per_device_resource(0),
        lambda: mr.available_device_memory(),
    ],
)
def test_cuda_resources_without_driver(make):
    _rrmm._clear_per_device_resources()
    with pytest.raises(RuntimeError, match="driver"):
        make()


def test_callback_resource(sim_mr):
    calls = []

    def alloc(size, stream):
        calls.append(("alloc", size, stream))
        return sim_mr.allocate(size, stream)

    def dealloc(ptr, size, stream):
        calls.append(("free", size, stream))
        sim_mr.deallocate(ptr, size, stream)

    m = mr.CallbackMemoryResource(alloc, dealloc)
    b = rrmm.DeviceBuffer(size=300, mr=m)
    assert calls == [("alloc", 300, DEFAULT_STREAM)]
    del b
    assert calls[-1] == ("free", 300, DEFAULT_STREAM)
    assert sim_mr.bytes_in_use() == 0


def test_callback_exceptions_propagate():
    def alloc(size, stream):
        raise KeyError("boom")

    def oom(size, stream):
        raise MemoryError("no memory here")

    def bad_return(size, stream):
        return "not an int"

    # As RMM: an exception that is not a MemoryError or RuntimeError arrives as a RuntimeError
    # (the original as its cause).
    with pytest.raises(RuntimeError, match="boom") as info:
        mr.CallbackMemoryResource(alloc, lambda p, s, st: None).allocate(10)
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(MemoryError, match="no memory here"):
        rrmm.DeviceBuffer(size=10, mr=mr.CallbackMemoryResource(oom, lambda p, s, st: None))
    with pytest.raises(RuntimeError) as info:  # a bad return value, raised as RMM raises it
        mr.CallbackMemoryResource(bad_return, lambda p, s, st: None).allocate(10)
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(TypeError):
        mr.CallbackMemoryResource(1, 2)


# ------------------------------------------------------------------ suballocators


def test_pool(sim_mr):
    p = mr.PoolMemoryResource(sim_mr, initial_pool_size="16MiB", maximum_pool_size="32MiB")
    assert p.upstream_mr is sim_mr
    assert p.get_upstream() is sim_mr
    assert p.pool_size() == 16 << 20
    a = p.allocate(1 << 20)
    b = p.allocate(1 << 20)
    assert p.free_bytes() == 14 << 20
    assert p.free_block_count() >= 1
    assert p.largest_free_block() <= p.free_bytes()
    with pytest.raises(MemoryError):
        p.allocate(64 << 20)
    p.deallocate(a, 1 << 20)
    p.deallocate(b, 1 << 20)
    assert p.free_bytes() == p.pool_size()
    released = p.release()
    assert released >= 0
    assert p.pool_size() == (16 << 20) - released


def test_pool_size_errors(sim_mr):
    with pytest.raises(RuntimeError, match="multiple of 256"):
        mr.PoolMemoryResource(sim_mr, 1000)
    with pytest.raises(RuntimeError, match="Initial pool size exceeds the maximum pool size"):
        mr.PoolMemoryResource(sim_mr, 2 << 20, 1 << 20)
    with pytest.raises(TypeError):
        mr.PoolMemoryResource(None)
    with pytest.raises(TypeError):
        mr.PoolMemoryResource(object())


def test_pool_default_size_is_half_of_free(sim_mr):
    p = mr.PoolMemoryResource(sim_mr)
    assert p.pool_size() == 512 << 20


def test_device_buffer_over_pool_over_system():
    p = mr.PoolMemoryResource(mr.SystemMemoryResource(), "1MiB")
    b = rrmm.DeviceBuffer.to_device(b"pooled", mr=p)
    assert b.tobytes() == b"pooled"


def test_fixed_size(sim_mr):
    f = mr.FixedSizeMemoryResource(sim_mr, block_size="64KiB", blocks_to_preallocate=4)
    assert f.block_size() == 64 << 10
    a = f.allocate(1000)
    f.deallocate(a, 1000)
    with pytest.raises(MemoryError):
        f.allocate(128 << 10)
    g = mr.FixedSizeMemoryResource(sim_mr)
    assert g.block_size() == 1 << 20


def test_binning(sim_mr):
    b = mr.BinningMemoryResource(sim_mr, 10, 12)
    assert b.bin_mrs == []
    fixed = mr.FixedSizeMemoryResource(sim_mr, 1 << 16, 2)
    b.add_bin(1 << 16, fixed)
    b.add_bin("128KiB")
    assert b.bin_mrs == [fixed]
    for size in (1, 1000, 4096, 60000, 100000, 1 << 20):
        p = b.allocate(size)
        b.deallocate(p, size)
    empty = mr.BinningMemoryResource(sim_mr)
    p = empty.allocate(100)
    empty.deallocate(p, 100)


# ------------------------------------------------------------------ adaptors


def test_limiting(sim_mr):
    lim = mr.LimitingResourceAdaptor(sim_mr, "1MiB")
    assert lim.get_allocation_limit() == 1 << 20
    p = lim.allocate(1000)
    assert lim.get_allocated_bytes() == 1024
    with pytest.raises(MemoryError, match="Exceeded memory limit"):
        lim.allocate(1 << 20)
    lim.deallocate(p, 1000)
    assert lim.get_allocated_bytes() == 0


def test_tracking(sim_mr):
    t = mr.TrackingResourceAdaptor(sim_mr)
    p = t.allocate(1000)
    assert t.get_allocated_bytes() == 1000
    assert hex(p) in t.get_outstanding_allocations_str()
    t.log_outstanding_allocations()
    t.deallocate(p, 1000)
    assert t.get_allocated_bytes() == 0
    assert mr.TrackingResourceAdaptor(sim_mr, capture_stacks=True).get_allocated_bytes() == 0


def test_failure_callback(sim_mr):
    small = mr.LimitingResourceAdaptor(sim_mr, 4096)
    seen = []

    def callback(nbytes):
        seen.append(nbytes)
        return len(seen) < 3

    f = mr.FailureCallbackResourceAdaptor(small, callback)
    with pytest.raises(MemoryError):
        f.allocate(8192)
    assert seen == [8192, 8192, 8192]
    assert f.callback is callback

    def raising(nbytes):
        raise ZeroDivisionError("from callback")

    with pytest.raises(RuntimeError, match="from callback"):  # as RMM raises it
        mr.FailureCallbackResourceAdaptor(small, raising).allocate(8192)
    p = f.allocate(100)
    f.deallocate(p, 100)


def test_failure_callback_exception_is_the_very_one_raised_and_never_reused(sim_mr):
    # Issue 9: the callback's exception was stashed per thread and matched by message text, so
    # a later, unrelated out-of-memory error could raise it.
    small = mr.LimitingResourceAdaptor(sim_mr, 4096)
    raised = ZeroDivisionError("from callback")

    def raising(nbytes):
        raise raised

    # RMM raises it as a RuntimeError caused by the callback's exception.
    with pytest.raises(RuntimeError, match="from callback") as info:
        mr.FailureCallbackResourceAdaptor(small, raising).allocate(8192)
    assert info.value.__cause__ is raised
    with pytest.raises(MemoryError, match="Exceeded memory limit"):
        small.allocate(8192)
    refusing = mr.FailureCallbackResourceAdaptor(small, lambda nbytes: False)
    with pytest.raises(MemoryError, match="Exceeded memory limit"):
        refusing.allocate(8192)


def test_prefetch_adaptor_over_host():
    pf = mr.PrefetchResourceAdaptor(mr.SystemMemoryResource())
    b = rrmm.DeviceBuffer.to_device(b"abc", mr=pf)
    assert b.tobytes() == b"abc"


def test_logging_adaptor(tmp_path, sim_mr):
    name = tmp_path / "log.csv"
    log = mr.LoggingResourceAdaptor(sim_mr, str(name))
    assert log.get_file_name() == str(tmp_path / "log.dev0.csv")
    p = log.allocate(1000)
    log.deallocate(p, 1000)
    log.flush()
    lines = (tmp_path / "log.dev0.csv").read_text().splitlines()
    assert lines[0] == "Thread,Time,Action,Pointer,Size,Stream"
    assert lines[1].split(",")[2] == "allocate"
    assert lines[2].split(",")[2] == "free"
    assert lines[1].split(",")[4] == "1000"


def test_logging_adaptor_file_name_from_env(tmp_path, monkeypatch, sim_mr):
    monkeypatch.setenv("RMM_LOG_FILE", str(tmp_path / "env.csv"))
    log = mr.LoggingResourceAdaptor(sim_mr)
    assert log.get_file_name() == str(tmp_path / "env.dev0.csv")
    monkeypatch.delenv("RMM_LOG_FILE")
    with pytest.raises(ValueError):
        mr.LoggingResourceAdaptor(sim_mr)
    log2 = mr.LoggingResourceAdaptor(sim_mr, os.fspath(tmp_path / "b.csv").encode())
    assert log2.get_file_name().endswith("b.dev0.csv")


def test_statistics_adaptor_counts(sim_mr):
    s = mr.StatisticsResourceAdaptor(sim_mr)
    a = s.allocate(1000)
    b = s.allocate(500)
    st = s.allocation_counts
    assert isinstance(st, rrmm.statistics.Statistics)
    assert (st.current_bytes, st.current_count, st.peak_bytes, st.peak_count) == (1500, 2, 1500, 2)
    s.deallocate(a, 1000)
    st = s.allocation_counts
    assert (st.current_bytes, st.current_count, st.peak_bytes, st.total_bytes, st.total_count) == (
        500,
        1,
        1500,
        1500,
        2,
    )
    before = s.push_counters()
    assert before == st
    s.deallocate(b, 500)
    inner = s.allocation_counts
    assert inner.current_bytes == -500 and inner.current_count == -1
    c = s.allocate(200)
    popped = s.pop_counters()
    assert popped.total_bytes == 200 and popped.peak_bytes == 0
    after = s.allocation_counts
    # parent.peak = max(parent.value + child.peak, parent.peak); value += child.value
    assert after.current_bytes == 500 - 500 + 200
    assert after.total_bytes == 1700
    assert after.peak_bytes == 1500
    with pytest.raises(IndexError):
        s.pop_counters()
    s.deallocate(c, 200)


def test_aligned_adaptor(sim_mr):
    a = mr.AlignedResourceAdaptor(sim_mr, 4096, 1024)
    p = a.allocate(2000)
    assert p % 4096 == 0
    a.deallocate(p, 2000)
    with pytest.raises(ValueError):
        mr.AlignedResourceAdaptor(sim_mr, 1000)


# ------------------------------------------------------------------ per-device table


def test_current_resource_round_trip(sim_mr):
    try:
        mr.set_current_device_resource(sim_mr)
        assert mr.get_current_device_resource() is sim_mr
        assert mr.get_per_device_resource(0) is sim_mr
        assert mr.get_current_device_resource_type() is mr.SimulatedMemoryResource
        assert mr.is_initialized()
        assert rrmm.is_initialized()
        other = mr.SystemMemoryResource()
        mr.set_per_device_resource(0, other)
        assert mr.get_current_device_resource() is other
        with pytest.raises(TypeError):
            mr.set_current_device_resource("not a resource")
    finally:
        _rrmm._clear_per_device_resources()
    assert not mr.is_initialized()


def test_huge_device_ordinals_are_value_errors_naming_the_ordinal(sim_mr):
    # Issue 9: 2**40 aborted the interpreter (a table indexed by ordinal); 10**8 took 10 s and
    # 2.4 GB.
    import time

    for ordinal in (2**40, 10**8, 1024):
        started = time.monotonic()
        with pytest.raises(ValueError, match=str(ordinal)):
            mr.set_per_device_resource(ordinal, sim_mr)
        with pytest.raises(ValueError, match=str(ordinal)):
            mr.get_per_device_resource(ordinal)
        assert time.monotonic() - started < 1.0
    try:
        mr.set_per_device_resource(3, sim_mr)  # simulated memory may stand for device 3
        assert mr.get_per_device_resource(3) is sim_mr
        p = sim_mr.allocate(256)
        sim_mr.deallocate(p, 256)
    finally:
        _rrmm._clear_per_device_resources()


def test_upstream_kept_alive(sim_mr):
    p = mr.PoolMemoryResource(mr.StatisticsResourceAdaptor(sim_mr), "1MiB")
    assert isinstance(p.upstream_mr, mr.StatisticsResourceAdaptor)
    assert p.upstream_mr.upstream_mr is sim_mr
