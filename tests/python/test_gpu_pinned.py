"""GPU tests of pinned host memory (issue 20) through the Python API: HostBuffer over pinned
memory, asynchronous copies with the data checked, the NUMA node, the pinned pool of
reinitialize, CuPy's pinned allocator hook and PyTorch over the same memory. Skipped with a
reason where there is no CUDA driver or device."""

from __future__ import annotations

import subprocess
import sys

import pytest
import rrmm
from conftest import skip_module_without_gpu
from rrmm import _rrmm, mr

skip_module_without_gpu()

np = pytest.importorskip("numpy")

MiB = 1 << 20


@pytest.fixture(autouse=True)
def default_host_resource():
    before = mr.get_current_host_resource()
    yield
    mr.set_current_host_resource(before)


def test_a_pinned_host_buffer_round_trips_asynchronously_on_a_stream():
    hb = rrmm.HostBuffer(64 * MiB)
    assert hb.is_pinned and isinstance(hb.mr, mr.PinnedHostMemoryResource)
    data = np.arange(64 * MiB, dtype=np.uint8) * 7
    np.asarray(hb)[:] = data
    stream = rrmm.pylibrmm.stream.Stream()
    db = rrmm.DeviceBuffer(size=64 * MiB, stream=stream)
    db.copy_from_host(hb, stream=stream)  # queued, not waited for
    back = rrmm.HostBuffer(64 * MiB)
    db.copy_to_host(back, stream=stream)
    # Host access waits for the queued copies.
    assert np.array_equal(np.asarray(back), data)
    assert back.tobytes()[:8] == data[:8].tobytes()


def test_the_pinned_resource_says_its_node_and_rrmm_info_shows_it():
    pinned = mr.PinnedHostMemoryResource()
    node, _nodes = _rrmm.host_numa_node(0)
    assert pinned.numa_node == node
    assert f"numa_node={node if node is not None else 'the process'}" in repr(pinned)
    out = subprocess.run([sys.executable, "-m", "rrmm", "info"], capture_output=True, text=True,
                         check=True).stdout
    assert "host NUMA node for pinned memory" in out
    print(out)


def test_reinitialize_sets_a_pinned_pool_as_the_host_resource():
    rrmm.reinitialize(pool_allocator=True, initial_pool_size="256MiB",
                      pinned_pool_size="512MiB")
    host = mr.get_current_host_resource()
    assert isinstance(host, mr.PoolMemoryResource)
    assert host.pool_size() == 512 * MiB
    hb = rrmm.HostBuffer(8 * MiB)
    assert hb.mr is host and hb.is_pinned


def test_cupy_pinned_allocator_uses_the_current_host_resource():
    cupy = pytest.importorskip("cupy")
    from rrmm.allocators.cupy import rmm_cupy_pinned_allocator

    pool = mr.PoolMemoryResource(mr.PinnedHostMemoryResource(), initial_pool_size=64 * MiB)
    mr.set_current_host_resource(pool)
    stats_before = pool.pool_size()
    old = cupy.cuda.get_pinned_memory_allocator() if hasattr(
        cupy.cuda, "get_pinned_memory_allocator") else None
    cupy.cuda.set_pinned_memory_allocator(rmm_cupy_pinned_allocator)
    try:
        mem = cupy.cuda.alloc_pinned_memory(4 * MiB)
        assert mem.ptr != 0
        a = cupy.arange(MiB, dtype=cupy.float32)
        host = np.frombuffer(mem, dtype=np.float32, count=MiB)
        a.get(out=host)
        assert host[12345] == 12345.0
        assert pool.pool_size() == stats_before  # served by the pool
    finally:
        cupy.cuda.set_pinned_memory_allocator(old)


def test_torch_uses_a_host_buffer_without_a_copy():
    torch = pytest.importorskip("torch")
    if sys.version_info < (3, 12):
        pytest.skip("torch.frombuffer needs the buffer protocol of Python 3.12")
    # PyTorch answers is_pinned() only once its CUDA state is initialized (else False).
    torch.cuda.init()
    hb = rrmm.HostBuffer(4 * MiB)
    t = torch.frombuffer(hb, dtype=torch.uint8)
    assert t.data_ptr() == hb.ptr and t.is_pinned()
    t.fill_(3)
    assert hb.tobytes()[:4] == b"\x03\x03\x03\x03"
    g = t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert int(g.sum()) == 3 * 4 * MiB
