"""DeviceBuffer's whole API on host memory (SystemMemoryResource): real bytes, no GPU."""

from __future__ import annotations

import copy
import pickle
import sys

import pytest
import rrmm
from rrmm.pylibrmm.device_buffer import (
    DeviceBuffer,
    copy_device_to_ptr,
    copy_host_to_ptr,
    copy_ptr_to_host,
    to_device,
)
from rrmm.pylibrmm.stream import DEFAULT_STREAM

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.usefixtures("system_mr")


def test_same_class_everywhere():
    assert rrmm.DeviceBuffer is DeviceBuffer
    assert rrmm.pylibrmm.DeviceBuffer is DeviceBuffer


@pytest.mark.parametrize("size", [0, 1, 10, 1000, 1 << 20])
def test_attributes(size, system_mr):
    b = DeviceBuffer(size=size)
    assert b.size == b.nbytes == len(b) == size
    assert b.__sizeof__() == size
    assert b.capacity() == size
    assert b.mr is system_mr
    assert b.stream == DEFAULT_STREAM
    if size == 0:
        assert b.ptr == 0
    else:
        assert b.ptr != 0 and b.ptr % 256 == 0
    assert b.__cuda_array_interface__ == {
        "data": (b.ptr, False),
        "shape": (size,),
        "strides": None,
        "typestr": "|u1",
        "version": 0,
    }


def test_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        DeviceBuffer(0, 10)  # type: ignore[misc]


def test_default_buffer_is_empty():
    b = DeviceBuffer()
    assert b.size == 0 and b.ptr == 0
    assert b.tobytes() == b""


def test_explicit_mr(sim_mr):
    b = DeviceBuffer(size=1000, mr=sim_mr)
    assert b.mr is sim_mr
    assert sim_mr.bytes_in_use() == 1024
    del b
    assert sim_mr.bytes_in_use() == 0


def test_mr_none_means_current(system_mr):
    assert DeviceBuffer(size=8, mr=None).mr is system_mr


def test_bad_mr_is_type_error():
    with pytest.raises(TypeError):
        DeviceBuffer(size=8, mr=object())


def test_size_errors():
    with pytest.raises(OverflowError):
        DeviceBuffer(size=-1)
    with pytest.raises(TypeError):
        DeviceBuffer(size=1.5)
    with pytest.raises(TypeError):
        DeviceBuffer(size="10")


def test_stream_none_is_type_error():
    with pytest.raises(TypeError, match="stream argument cannot be None"):
        DeviceBuffer(size=10, stream=None)
    b = DeviceBuffer(size=10)
    for call in (
        lambda: b.copy_to_host(stream=None),
        lambda: b.copy_from_host(b"x", stream=None),
        lambda: b.tobytes(stream=None),
        lambda: b.resize(5, stream=None),
        lambda: b.reserve(50, stream=None),
        lambda: DeviceBuffer.to_device(b"x", stream=None),
        lambda: to_device(b"x", stream=None),
    ):
        with pytest.raises(TypeError, match="stream argument cannot be None"):
            call()


def test_ptr_constructor_copies():
    src = DeviceBuffer.to_device(b"hello world")
    b = DeviceBuffer(ptr=src.ptr, size=src.size)
    assert b.ptr != src.ptr
    assert b.tobytes() == b"hello world"


def test_to_device_and_back():
    data = bytes(range(256)) * 7
    for b in (
        DeviceBuffer.to_device(data),
        to_device(data),
        to_device(bytearray(data)),
        to_device(memoryview(data)),
        to_device(np.frombuffer(data, dtype=np.uint8)),
    ):
        assert isinstance(b, DeviceBuffer)
        assert b.size == len(data)
        assert b.tobytes() == data
        assert bytes(b) == data
        host = b.copy_to_host()
        assert isinstance(host, np.ndarray) and host.dtype == np.uint8
        assert host.tobytes() == data


def test_to_device_checks_buffer():
    with pytest.raises(TypeError):
        to_device(123)
    with pytest.raises(TypeError):
        to_device("text")
    with pytest.raises(ValueError):
        to_device(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError):
        to_device(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(ValueError):
        to_device(np.zeros(8, dtype=np.uint8)[::2])


def test_copy_to_host_into_array():
    b = to_device(b"abcdef")
    out = np.zeros(10, dtype=np.uint8)
    assert b.copy_to_host(out) is out
    assert out[:6].tobytes() == b"abcdef"
    ba = bytearray(6)
    b.copy_to_host(ba)
    assert ba == b"abcdef"
    with pytest.raises(ValueError):
        b.copy_to_host(np.zeros(3, dtype=np.uint8))
    with pytest.raises(ValueError):
        b.copy_to_host(np.zeros(10, dtype=np.int32))
    with pytest.raises(ValueError):
        b.copy_to_host(b"readonly")


def test_copy_from_host():
    b = DeviceBuffer(size=8)
    b.copy_from_host(b"12345678")
    assert b.tobytes() == b"12345678"
    b.copy_from_host(np.frombuffer(b"ab", dtype=np.uint8))
    assert b.tobytes() == b"ab345678"
    with pytest.raises(ValueError):
        b.copy_from_host(b"123456789")
    with pytest.raises(TypeError):
        b.copy_from_host(42)


class FakeCudaArray:
    """`arr`'s bytes in a rrmm system-memory buffer, exposed through __cuda_array_interface__
    (without a GPU, system memory is the memory rrmm can copy through a raw address)."""

    def __init__(self, arr, strides=None):
        self.arr = arr
        self.buf = to_device(arr.tobytes(), mr=rrmm.mr.SystemMemoryResource())
        self.__cuda_array_interface__ = {
            "data": (self.buf.ptr, False),
            "shape": arr.shape,
            "strides": strides,
            "typestr": arr.dtype.str,
            "version": 3,
        }


class HostCudaArray:
    """Pageable host memory (a numpy array) posing as device memory."""

    def __init__(self, arr):
        self.arr = arr
        self.__cuda_array_interface__ = {
            "data": (arr.__array_interface__["data"][0], False),
            "shape": arr.shape,
            "strides": None,
            "typestr": arr.dtype.str,
            "version": 3,
        }


def test_copy_from_device():
    src = np.arange(4, dtype=np.int32)
    b = DeviceBuffer(size=16)
    b.copy_from_device(FakeCudaArray(src))
    assert b.tobytes() == src.tobytes()
    # Pageable host memory behind an array interface is copied, as RMM's cudaMemcpyDefault does.
    b.copy_from_device(HostCudaArray(np.arange(4, 8, dtype=np.int32)))
    assert b.tobytes() == np.arange(4, 8, dtype=np.int32).tobytes()
    b.copy_from_device(FakeCudaArray(src))
    assert b.tobytes() == src.tobytes()
    b2 = DeviceBuffer(size=16)
    b2.copy_from_device(to_device(b"xyz"))
    assert b2.tobytes()[:3] == b"xyz"
    with pytest.raises(ValueError, match="cuda_array_interface"):
        b.copy_from_device(b"abc")
    with pytest.raises(ValueError):
        b.copy_from_device(FakeCudaArray(np.arange(8, dtype=np.int32)))
    with pytest.raises(ValueError):
        b.copy_from_device(FakeCudaArray(np.zeros((2, 2), dtype=np.uint8)))
    with pytest.raises(ValueError):
        b.copy_from_device(FakeCudaArray(np.zeros(4, dtype=np.uint8), strides=(2,)))


def test_resize_and_reserve_keep_bytes():
    b = to_device(b"0123456789")
    ptr = b.ptr
    b.resize(4)
    assert b.size == 4 and b.capacity() == 10 and b.ptr == ptr
    assert b.tobytes() == b"0123"
    b.resize(20)
    assert b.size == 20 and b.capacity() == 20
    assert b.tobytes()[:4] == b"0123"
    b.reserve(100)
    assert b.size == 20 and b.capacity() == 100
    assert b.tobytes()[:4] == b"0123"
    b.reserve(10)
    assert b.capacity() == 100


def test_resize_changes_stream():
    s = rrmm.pylibrmm.stream.PER_THREAD_DEFAULT_STREAM
    b = DeviceBuffer(size=4)
    b.resize(8, stream=s)
    assert b.stream == s


def test_copy_is_deep():
    b = to_device(b"abc")
    for c in (b.copy(), copy.copy(b), copy.deepcopy(b)):
        assert c.ptr != b.ptr
        assert c.tobytes() == b"abc"
        assert c.mr is b.mr


def test_prefetch_is_noop_on_host_memory():
    b = to_device(bytes(range(10)))
    ptr = b.ptr
    assert b.prefetch() is None
    assert b.prefetch(device=0, stream=DEFAULT_STREAM) is None
    # Nothing moved or changed.
    assert b.ptr == ptr and b.size == 10
    assert b.tobytes() == bytes(range(10))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle(protocol):
    b = to_device(b"pickled bytes")
    c = pickle.loads(pickle.dumps(b, protocol=protocol))
    assert isinstance(c, DeviceBuffer)
    assert c.tobytes() == b"pickled bytes"


@pytest.mark.skipif(pickle.HIGHEST_PROTOCOL < 5, reason="needs pickle protocol 5")
def test_pickle_out_of_band():
    b = to_device(bytes(range(100)))
    buffers = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1
    assert len(data) < 100
    c = pickle.loads(data, buffers=buffers)
    assert c.tobytes() == bytes(range(100))


def test_pointer_copies():
    b = to_device(b"abcdef")
    out = bytearray(6)
    copy_ptr_to_host(b.ptr, out)
    assert out == b"abcdef"
    copy_host_to_ptr(b"XY", b.ptr)
    assert b.tobytes() == b"XYcdef"
    c = DeviceBuffer(size=6)
    copy_device_to_ptr(b.ptr, c.ptr, 6)
    assert c.tobytes() == b"XYcdef"
    with pytest.raises(TypeError):
        copy_ptr_to_host(b.ptr, out, stream=None)
    with pytest.raises(ValueError):
        copy_ptr_to_host(b.ptr, b"readonly")


def test_simulated_memory_cannot_be_read(sim_mr):
    b = DeviceBuffer(size=10, mr=sim_mr)
    with pytest.raises(RuntimeError):
        b.tobytes()


def test_buffer_keeps_resource_alive():
    mr = rrmm.mr.SystemMemoryResource()
    b = DeviceBuffer(size=10, mr=mr)
    refs = sys.getrefcount(mr)
    del mr
    assert b.mr is not None
    assert refs >= 3


def test_out_of_memory_is_memory_error():
    mr = rrmm.mr.SimulatedMemoryResource(1 << 20)
    with pytest.raises(MemoryError):
        DeviceBuffer(size=2 << 20, mr=mr)
