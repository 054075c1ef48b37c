"""rrmm.mr.ArenaMemoryResource on a GPU: exhaustion as MemoryError then recovery, DeviceBuffer
round trips, threads on their own streams and per-thread default streams, and the CuPy and
PyTorch hooks over an arena. Skipped without a CUDA driver and device."""

from __future__ import annotations

import pytest
import rrmm
from conftest import run_in_child, run_threads, skip_module_without_gpu
from rrmm import _rrmm, mr
from rrmm.pylibrmm.stream import PER_THREAD_DEFAULT_STREAM, Stream

skip_module_without_gpu()

MIB = 1 << 20


@pytest.fixture
def arena():
    a = mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=256 * MIB)
    mr.set_current_device_resource(a)
    yield a
    _rrmm._clear_per_device_resources()


def test_exhaustion_raises_memory_error_then_the_arena_works():
    a = mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=64 * MIB)
    p = a.allocate(40 * MIB)
    with pytest.raises(MemoryError, match=r"No room in arena\."):
        a.allocate(40 * MIB, PER_THREAD_DEFAULT_STREAM)
    a.deallocate(p, 40 * MIB)
    b = rrmm.DeviceBuffer(size=64 * MIB, mr=a)
    b.copy_from_host(b"\x5a" * 4096)
    assert b.tobytes()[:4096] == b"\x5a" * 4096


def test_device_buffer_round_trip(arena):
    data = bytes(range(256)) * 4096
    buf = rrmm.DeviceBuffer.to_device(data)
    assert buf.tobytes() == data
    big = rrmm.DeviceBuffer.to_device(data * 3)  # above a superblock: from the global arena
    assert big.tobytes() == data * 3
    del buf, big
    assert arena.free_bytes() == 256 * MIB


@pytest.mark.parametrize("ptds", [False, True], ids=["own_streams", "per_thread_default"])
def test_threads_write_and_check_their_patterns(arena, ptds):
    def work(t: int) -> None:
        stream = PER_THREAD_DEFAULT_STREAM if ptds else Stream(flags=1)
        live = []
        for i in range(200):
            if len(live) < 8 and i % 3:
                n = 256 + (i * 7919 + t * 104729) % (2 * MIB)
                pattern = bytes([(t * 16 + i) % 251 + 1]) * n
                live.append((rrmm.DeviceBuffer.to_device(pattern, stream=stream), pattern))
            elif live:
                buf, pattern = live.pop(i % len(live))
                assert buf.tobytes(stream=stream) == pattern, f"thread {t}: corrupted"
        for buf, pattern in live:
            assert buf.tobytes(stream=stream) == pattern
        stream.synchronize()

    run_threads(16, work)
    assert arena.free_bytes() == 256 * MIB


def test_cupy_over_an_arena(arena):
    cupy = pytest.importorskip("cupy")
    from rrmm.allocators.cupy import rmm_cupy_allocator

    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        y = (x * 2).sum()
        assert float(y) == float((1 << 20) * ((1 << 20) - 1))
        assert arena.free_bytes() < 256 * MIB
        del x, y
    finally:
        cupy.cuda.set_allocator(previous)


def test_torch_over_an_arena():
    pytest.importorskip("torch")
    code = """
    import torch
    import rrmm
    from rrmm.allocators.torch import rmm_torch_allocator
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    arena = rrmm.mr.ArenaMemoryResource(rrmm.mr.CudaMemoryResource(), arena_size=256 << 20)
    rrmm.mr.set_current_device_resource(arena)
    a = torch.randn(512, 256)
    b = torch.randn(256, 128)
    assert torch.allclose((a.cuda() @ b.cuda()).cpu(), a @ b, rtol=1e-3, atol=1e-3)
    assert arena.free_bytes() < 256 << 20
    print("CHILD OK")
    """
    run_in_child(code, timeout=240)
