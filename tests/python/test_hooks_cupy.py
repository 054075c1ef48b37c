"""GPU tests of rrmm.allocators.cupy (skipped without CuPy or a GPU)."""

import gc

import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
try:
    _GPUS = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError:  # no driver / no device
    _GPUS = 0
if _GPUS == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

from rrmm import _rrmm
from rrmm.allocators.cupy import (
    rmm_cupy_allocator,
    rmm_cupy_pinned_allocator,
    rrmm_cupy_allocator,
    rrmm_cupy_unowned_allocator,
)

HOOKS = [rmm_cupy_allocator, rrmm_cupy_unowned_allocator]


def _stream_of(mem_ptr):
    """The stream rrmm recorded for a CuPy MemoryPointer made by either hook."""
    owner = getattr(mem_ptr.mem, "_owner", None)
    if isinstance(owner, _rrmm.HookAllocation):
        return owner.stream
    recorded = _rrmm.cupy_c_allocation(mem_ptr.mem.ptr)
    assert recorded is not None, "not an rrmm allocation"
    return recorded[1]


def _mr_module():
    import rrmm.mr

    return rrmm.mr


def _count(stats, key):
    counts = stats.allocation_counts
    return counts[key] if isinstance(counts, dict) else getattr(counts, key)


@pytest.fixture(params=HOOKS, ids=["c_function", "unowned"])
def rrmm_allocator(request):
    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(request.param)
    try:
        yield
    finally:
        cupy.cuda.set_allocator(previous)


def test_alias():
    assert rrmm_cupy_allocator is rmm_cupy_allocator


def test_memory_pointer_owns_an_rrmm_allocation():
    mp = rmm_cupy_allocator(1 << 20)
    assert isinstance(mp, cupy.cuda.MemoryPointer)
    assert type(mp.mem).__name__ == "CFunctionAllocatorMemory"
    assert _rrmm.cupy_c_allocation(mp.ptr) == (1 << 20, cupy.cuda.get_current_stream().ptr)
    assert mp.device_id == cupy.cuda.runtime.getDevice()
    live = _rrmm.cupy_c_live_allocations()
    ptr = mp.ptr
    del mp
    assert _rrmm.cupy_c_live_allocations() == live - 1
    assert _rrmm.cupy_c_allocation(ptr) is None

    mp = rrmm_cupy_unowned_allocator(1 << 20)
    owner = mp.mem._owner
    assert isinstance(owner, _rrmm.HookAllocation)
    assert mp.ptr == owner.ptr != 0
    assert mp.mem.size == 1 << 20
    assert mp.device_id == cupy.cuda.runtime.getDevice()
    del mp, owner


@pytest.mark.parametrize("hook", HOOKS, ids=["c_function", "unowned"])
def test_size_zero(hook):
    mp = hook(0)
    assert mp.mem.size == 0
    with cupy.cuda.Device(0):
        cupy.cuda.set_allocator(hook)
        try:
            a = cupy.empty((0,), dtype=cupy.float32)
            assert a.size == 0
        finally:
            cupy.cuda.set_allocator(None)


def test_real_computation(rrmm_allocator):
    x = cupy.arange(1_000_000, dtype=cupy.float64)
    y = ((x * 2 + 1) * x - 3).sum()
    n = 1_000_000
    expected = 2 * (n - 1) * n * (2 * n - 1) / 6 + (n - 1) * n / 2 - 3 * n
    assert float(y) == pytest.approx(expected, rel=1e-12)
    a = cupy.random.rand(256, 256)
    b = cupy.random.rand(256, 256)
    assert cupy.allclose(a @ b, cupy.asarray(cupy.asnumpy(a) @ cupy.asnumpy(b)))


def test_current_stream_is_honoured(rrmm_allocator):
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        a = cupy.ones(1000, dtype=cupy.float32)
        assert _stream_of(a.data) == stream.ptr
        b = a * 3
    stream.synchronize()
    assert float(b.sum()) == 3000.0
    c = cupy.ones(10)
    assert _stream_of(c.data) == cupy.cuda.get_current_stream().ptr


def test_memory_lives_as_long_as_the_array(rrmm_allocator):
    mr = _mr_module()
    stats = mr.StatisticsResourceAdaptor(mr.CudaMemoryResource())
    previous = mr.get_current_device_resource()
    mr.set_current_device_resource(stats)
    try:
        a = cupy.zeros(1 << 18, dtype=cupy.float32)  # 1 MiB
        view = a[10:20]
        assert _count(stats, "current_bytes") >= 1 << 20
        del a
        gc.collect()
        assert _count(stats, "current_bytes") >= 1 << 20  # the view keeps it alive
        view += 1
        assert float(view.sum()) == 10.0
        del view
        gc.collect()
        assert _count(stats, "current_bytes") == 0
        assert _count(stats, "total_count") >= 1
    finally:
        mr.set_current_device_resource(previous)


def test_out_of_memory_raises_memory_error(rrmm_allocator):
    mr = _mr_module()
    limited = mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), allocation_limit=1 << 20)
    previous = mr.get_current_device_resource()
    mr.set_current_device_resource(limited)
    try:
        small = cupy.ones(1000)
        with pytest.raises(MemoryError):
            cupy.empty(2 << 20, dtype=cupy.uint8)
        assert float(small.sum()) == 1000.0
    finally:
        mr.set_current_device_resource(previous)


def test_pinned_allocator():
    mp = rmm_cupy_pinned_allocator(4096)
    assert isinstance(mp, cupy.cuda.PinnedMemoryPointer)
    previous = cupy.cuda.get_pinned_memory_allocator() if hasattr(
        cupy.cuda, "get_pinned_memory_allocator"
    ) else None
    cupy.cuda.set_pinned_memory_allocator(rmm_cupy_pinned_allocator)
    try:
        import cupyx

        host = cupyx.empty_pinned((1000,), dtype="float32")
        host[:] = 2.0
        dev = cupy.asarray(host)
        assert float(dev.sum()) == 2000.0
        back = cupy.asnumpy(dev * 2, out=cupyx.empty_pinned((1000,), dtype="float32"))
        assert float(back.sum()) == 4000.0
    finally:
        cupy.cuda.set_pinned_memory_allocator(previous)
    del mp


def _published_stream_getter():
    """CuPy's C `get_current_stream_ptr` capsule, or None when this CuPy does not publish it."""
    import importlib

    try:
        capi = importlib.import_module("cupy_backends.cuda.stream").__pyx_capi__
    except (ImportError, AttributeError):
        return None
    return capi.get("get_current_stream_ptr")


def test_stream_lookup_calls_cupys_c_function_when_published():
    import threading

    capsule = _published_stream_getter()
    if capsule is None:
        assert _rrmm.cupy_stream_lookup() == "python"
        return
    assert _rrmm.cupy_stream_lookup() == "c"
    assert _rrmm.call_stream_capsule(capsule) == cupy.cuda.get_current_stream().ptr
    seen = {}

    def in_thread():
        with cupy.cuda.Stream(non_blocking=True) as stream:
            seen["thread"] = (_rrmm.call_stream_capsule(capsule), stream.ptr)

    with cupy.cuda.Stream(non_blocking=True) as stream:
        worker = threading.Thread(target=in_thread)
        worker.start()
        worker.join()
        assert _rrmm.call_stream_capsule(capsule) == stream.ptr
    assert seen["thread"][0] == seen["thread"][1] != stream.ptr


def test_per_thread_default_stream_is_honoured():
    import os
    import subprocess
    import sys

    code = (
        "import cupy\n"
        "from rrmm import _rrmm\n"
        "from rrmm.allocators.cupy import rmm_cupy_allocator\n"
        "cupy.cuda.set_allocator(rmm_cupy_allocator)\n"
        "a = cupy.ones(1000)\n"
        "assert cupy.cuda.get_current_stream().ptr == 2, cupy.cuda.get_current_stream().ptr\n"
        "assert _rrmm.cupy_c_allocation(a.data.ptr)[1] == 2\n"
        "assert float(a.sum()) == 1000.0\n"
        "print('ok', _rrmm.cupy_stream_lookup())\n"
    )
    env = dict(os.environ, CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")
