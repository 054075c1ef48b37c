"""GPU tests: data round trips through every resource and every DeviceBuffer API, streams from
rrmm, CuPy and PyTorch. Skipped with a reason where there is no CUDA driver or device."""

from __future__ import annotations

import copy
import pickle

import pytest
import rrmm
from conftest import skip_module_without_gpu
from rrmm import _rrmm, mr
from rrmm.pylibrmm.device_buffer import (
    DeviceBuffer,
    copy_device_to_ptr,
    copy_host_to_ptr,
    copy_ptr_to_host,
    to_device,
)
from rrmm.pylibrmm.stream import (
    DEFAULT_STREAM,
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    CudaStreamFlags,
    Stream,
)

skip_module_without_gpu()

np = pytest.importorskip("numpy")


@pytest.fixture(autouse=True)
def fresh_table():
    _rrmm._clear_per_device_resources()
    yield
    _rrmm._clear_per_device_resources()


_OWNERS = []


def _async_view():
    """A view of a pool that an owning CudaAsyncMemoryResource keeps alive (as RMM requires)."""
    owner = mr.CudaAsyncMemoryResource()
    _OWNERS.append(owner)
    view = mr.CudaAsyncViewMemoryResource(owner.pool_handle())
    assert view.pool_handle() == owner.pool_handle()
    return view


RESOURCES = {
    "cuda": lambda: mr.CudaMemoryResource(),
    "managed": lambda: mr.ManagedMemoryResource(),
    "cuda_async": lambda: mr.CudaAsyncMemoryResource(),
    "cuda_async_initial": lambda: mr.CudaAsyncMemoryResource(
        initial_pool_size="64MiB", release_threshold="128MiB"
    ),
    "cuda_async_view": lambda: _async_view(),
    "pinned_host": lambda: mr.PinnedHostMemoryResource(),
    "pool_cuda": lambda: mr.PoolMemoryResource(mr.CudaMemoryResource(), "64MiB", "1GiB"),
    "pool_managed": lambda: mr.PoolMemoryResource(mr.ManagedMemoryResource(), "64MiB"),
    "pool_default_size": lambda: mr.PoolMemoryResource(mr.CudaMemoryResource()),
    "fixed_size": lambda: mr.FixedSizeMemoryResource(mr.CudaMemoryResource(), 4 << 20, 4),
    "binning": lambda: mr.BinningMemoryResource(mr.CudaMemoryResource(), 10, 20),
    "limiting": lambda: mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), "1GiB"),
    "statistics": lambda: mr.StatisticsResourceAdaptor(mr.CudaMemoryResource()),
    "tracking": lambda: mr.TrackingResourceAdaptor(mr.CudaMemoryResource()),
    "failure_callback": lambda: mr.FailureCallbackResourceAdaptor(
        mr.CudaMemoryResource(), lambda n: False
    ),
    "prefetch": lambda: mr.PrefetchResourceAdaptor(mr.ManagedMemoryResource()),
    "aligned": lambda: mr.AlignedResourceAdaptor(mr.CudaMemoryResource(), 4096),
}


def _payload(size: int) -> bytes:
    return (np.arange(size, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8).tobytes()


@pytest.mark.parametrize("name", sorted(RESOURCES))
@pytest.mark.parametrize("size", [1, 1000, 1 << 20, 3 << 20])
def test_round_trip_through_resource(name, size):
    resource = RESOURCES[name]()
    data = _payload(size)
    buf = DeviceBuffer.to_device(data, mr=resource)
    assert buf.mr is resource
    assert buf.ptr % 256 == 0
    assert buf.tobytes() == data
    assert buf.copy_to_host().tobytes() == data
    clone = buf.copy()
    assert clone.ptr != buf.ptr and clone.tobytes() == data


@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_allocate_deallocate_many(name):
    resource = RESOURCES[name]()
    ptrs = [(resource.allocate(s), s) for s in (256, 1000, 4096, 1 << 16, 1 << 20)]
    assert len({p for p, _ in ptrs}) == len(ptrs)
    for p, s in reversed(ptrs):
        resource.deallocate(p, s)


def test_logging_adaptor_on_gpu(tmp_path):
    log = mr.LoggingResourceAdaptor(mr.CudaMemoryResource(), str(tmp_path / "gpu.csv"))
    b = DeviceBuffer.to_device(b"logged", mr=log)
    assert b.tobytes() == b"logged"
    del b
    log.flush()
    with open(log.get_file_name()) as f:
        rows = f.read().splitlines()
    assert rows[0] == "Thread,Time,Action,Pointer,Size,Stream"
    assert [r.split(",")[2] for r in rows[1:]] == ["allocate", "free"]


def test_callback_resource_on_gpu():
    cuda = mr.CudaMemoryResource()
    cb = mr.CallbackMemoryResource(cuda.allocate, cuda.deallocate)
    b = DeviceBuffer.to_device(b"through python callbacks", mr=cb)
    assert b.tobytes() == b"through python callbacks"


def test_current_resource_default_is_cuda():
    assert isinstance(mr.get_current_device_resource(), mr.CudaMemoryResource)
    b = DeviceBuffer(size=10)
    assert isinstance(b.mr, mr.CudaMemoryResource)


def test_device_buffer_api_on_gpu():
    mr.set_current_device_resource(mr.PoolMemoryResource(mr.CudaMemoryResource(), "64MiB"))
    data = _payload(4096)
    b = to_device(data)
    assert DeviceBuffer(ptr=b.ptr, size=b.size).tobytes() == data
    out = np.zeros(5000, dtype=np.uint8)
    b.copy_to_host(out)
    assert out[:4096].tobytes() == data
    b.copy_from_host(b"\x01\x02\x03")
    assert b.tobytes()[:3] == b"\x01\x02\x03"
    c = DeviceBuffer(size=4096)
    c.copy_from_device(b)
    assert c.tobytes() == b.tobytes()
    host = bytearray(10)
    copy_ptr_to_host(b.ptr, host)
    assert bytes(host) == b.tobytes()[:10]
    copy_host_to_ptr(b"zz", c.ptr)
    assert c.tobytes()[:2] == b"zz"
    copy_device_to_ptr(b.ptr, c.ptr, 4096)
    assert c.tobytes() == b.tobytes()
    before = b.tobytes()
    b.resize(100)
    assert b.tobytes() == before[:100]
    b.resize(10000)
    assert b.tobytes()[:100] == before[:100]
    b.reserve(20000)
    assert b.capacity() == 20000 and b.tobytes()[:100] == before[:100]
    for dup in (copy.copy(b), copy.deepcopy(b), pickle.loads(pickle.dumps(b, protocol=5))):
        assert dup.tobytes() == b.tobytes()
    assert b.__cuda_array_interface__["data"] == (b.ptr, False)


def test_prefetch_managed():
    b = DeviceBuffer.to_device(b"managed" * 1000, mr=mr.ManagedMemoryResource())
    b.prefetch()
    b.prefetch(device=0, stream=DEFAULT_STREAM)
    assert b.tobytes() == b"managed" * 1000


def test_owned_streams():
    s = Stream()
    nb = Stream(flags=CudaStreamFlags.NON_BLOCKING)
    for stream in (s, nb, DEFAULT_STREAM, LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM):
        b = DeviceBuffer.to_device(b"on a stream", stream=stream)
        assert b.stream == stream
        assert b.tobytes(stream=stream) == b"on a stream"
        stream.synchronize()
    assert not s.is_default()
    pool = rrmm.pylibrmm.CudaStreamPool(4)
    assert pool.get_pool_size() == 4
    assert pool.get_stream(0) == pool.get_stream(4)
    pool.get_stream().synchronize()


def test_available_device_memory():
    free, total = mr.available_device_memory()
    assert 0 < free <= total


def test_reinitialize_on_gpu(tmp_path):
    rrmm.reinitialize(pool_allocator=True, initial_pool_size="64MiB", maximum_pool_size="256MiB")
    current = mr.get_current_device_resource()
    assert isinstance(current, mr.PoolMemoryResource)
    assert isinstance(current.upstream_mr, mr.CudaMemoryResource)
    assert current.pool_size() == 64 << 20
    assert DeviceBuffer.to_device(b"pool").tobytes() == b"pool"
    rrmm.reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size=1 << 26)
    assert isinstance(mr.get_current_device_resource().upstream_mr, mr.ManagedMemoryResource)
    rrmm.reinitialize(managed_memory=True)
    assert isinstance(mr.get_current_device_resource(), mr.ManagedMemoryResource)
    rrmm.reinitialize(logging=True, log_file_name=str(tmp_path / "re.csv"))
    assert isinstance(mr.get_current_device_resource(), mr.LoggingResourceAdaptor)
    assert rrmm.get_log_filenames()[0] == str(tmp_path / "re.dev0.csv")
    with pytest.raises(RuntimeError, match="Initial pool size exceeds the maximum pool size"):
        rrmm.reinitialize(pool_allocator=True, initial_pool_size=1 << 30, maximum_pool_size=1 << 20)
    rrmm.reinitialize()
    assert isinstance(mr.get_current_device_resource(), mr.CudaMemoryResource)


def test_pool_out_of_memory_then_works():
    pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), "16MiB", "32MiB")
    keep = DeviceBuffer(size=12 << 20, mr=pool)
    with pytest.raises(MemoryError):
        DeviceBuffer(size=20 << 20, mr=pool)  # 16 MiB initial (kept) + 20 MiB > 32 MiB
    assert pool.pool_size() == 16 << 20, "a failed request keeps the initial chunk"
    del keep
    assert DeviceBuffer.to_device(b"again", mr=pool).tobytes() == b"again"


def test_cuda_out_of_memory_is_memory_error():
    _, total = mr.available_device_memory()
    with pytest.raises(MemoryError):
        DeviceBuffer(size=total * 4, mr=mr.CudaMemoryResource())


def test_cupy_streams_and_arrays():
    cupy = pytest.importorskip("cupy")
    cs = cupy.cuda.Stream(non_blocking=True)
    s = Stream(cs)
    assert s.__cuda_stream__() == (0, cs.ptr)
    b = DeviceBuffer.to_device(b"cupy stream", stream=cs)
    assert b.stream == s
    assert b.tobytes(stream=cs) == b"cupy stream"
    arr = cupy.arange(16, dtype=cupy.uint8)
    c = DeviceBuffer(size=16)
    c.copy_from_device(arr)
    assert c.tobytes() == bytes(range(16))
    view = cupy.asarray(c)
    assert view.dtype == cupy.uint8 and int(view.sum()) == sum(range(16))


def test_torch_streams():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    ts = torch.cuda.Stream()
    s = Stream(ts)
    assert s.__cuda_stream__() == (0, ts.cuda_stream)
    b = DeviceBuffer.to_device(b"torch stream", stream=ts)
    assert b.tobytes(stream=s) == b"torch stream"
    t = torch.arange(8, dtype=torch.uint8, device="cuda")
    c = DeviceBuffer(size=8)
    c.copy_from_device(t)
    assert c.tobytes() == bytes(range(8))
