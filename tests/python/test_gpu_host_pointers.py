"""GPU: RMM's host-pointer API (issue 18's regression): `DeviceBuffer(ptr=<pageable host
address>, size=n)` copies host memory to the device, as RMM does, for device and managed
resources and from threads building buffers from slices of one host array; the data are
checked, and beside RMM when it is installed. Skipped with a reason without a GPU."""

from __future__ import annotations

import threading

import pytest
import rrmm
from conftest import skip_module_without_gpu
from rrmm import mr

skip_module_without_gpu()

np = pytest.importorskip("numpy")

RESOURCES = {
    "cuda": lambda m: m.CudaMemoryResource(),
    "managed": lambda m: m.ManagedMemoryResource(),
    "pool": lambda m: m.PoolMemoryResource(m.CudaMemoryResource(), 64 << 20),
}


def _libraries() -> list[object]:
    libs: list[object] = [rrmm]
    try:
        import rmm  # the reference, where installed

        if rmm is not rrmm:
            libs.append(rmm)
    except ImportError:
        pass
    return libs


@pytest.mark.parametrize("lib", _libraries(), ids=lambda m: m.__name__)
@pytest.mark.parametrize("make", list(RESOURCES.values()), ids=list(RESOURCES))
def test_device_buffer_from_a_pageable_host_address(lib, make) -> None:
    a = np.arange(50000, dtype=np.float32)
    buf = lib.DeviceBuffer(ptr=a.ctypes.data, size=a.nbytes, mr=make(lib.mr))
    back = buf.copy_to_host().view(np.float32)
    np.testing.assert_array_equal(back, a)


def test_threads_build_buffers_from_slices_of_one_host_array() -> None:
    a = np.arange(1 << 20, dtype=np.float32)
    parts = np.array_split(a, 8)
    out: list[bytes | None] = [None] * 8
    errors: list[BaseException] = []
    pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), 64 << 20)

    def work(i: int) -> None:
        try:
            p = parts[i]
            out[i] = rrmm.DeviceBuffer(ptr=p.ctypes.data, size=p.nbytes, mr=pool).tobytes()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert b"".join(b for b in out if b is not None) == a.tobytes()


def test_raw_copies_through_pageable_host_memory_and_a_bogus_address() -> None:
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    dev = rrmm.DeviceBuffer(size=src.nbytes, mr=mr.CudaMemoryResource())
    rrmm.pylibrmm.device_buffer.copy_host_to_ptr(src, dev.ptr)
    rrmm.pylibrmm.device_buffer.copy_device_to_ptr(dev.ptr, dst.ctypes.data, src.nbytes)
    np.testing.assert_array_equal(dst, src)
    with pytest.raises(ValueError, match="not memory rrmm can copy"):
        rrmm.DeviceBuffer(ptr=0x1000, size=16)
