"""GPU stress through the Python API: threads, each on its own non-blocking stream or on its
per-thread default stream, writing and checking data through DeviceBuffer over every
suballocator; buffer-to-buffer copies across threads; the CuPy and PyTorch hooks over an arena
and a pool from several threads at once, with results checked; exhaustion as MemoryError through
DeviceBuffer and the CuPy hook, then recovery. Skipped without a CUDA driver and device.

The number of rounds scales with RRMM_STRESS_PERCENT (default 100; scripts/gpu_run.sh's
sanitizer stage runs 25).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import pytest
import rrmm
from conftest import run_in_child, run_threads, skip_module_without_gpu
from rrmm import _rrmm, mr
from rrmm.pylibrmm.stream import PER_THREAD_DEFAULT_STREAM, Stream

skip_module_without_gpu()

MIB = 1 << 20
PERCENT = int(os.environ.get("RRMM_STRESS_PERCENT", "100"))
NON_BLOCKING = 1


def rounds(n: int) -> int:
    return max(20, n * PERCENT // 100)


def pattern(t: int, i: int, n: int) -> bytes:
    """``n`` bytes unique to thread ``t``'s ``i``-th buffer (a 4-byte word repeated)."""
    word = ((t & 0xFF) << 24 | (i & 0xFFFFFF)).to_bytes(4, "little")
    return (word * (n // 4 + 1))[:n]


RESOURCES: dict[str, Callable[[], mr.DeviceMemoryResource]] = {
    "pool": lambda: mr.PoolMemoryResource(mr.CudaMemoryResource(), 256 * MIB, 4096 * MIB),
    "arena": lambda: mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=1024 * MIB),
    "binning": lambda: mr.BinningMemoryResource(
        mr.PoolMemoryResource(mr.CudaMemoryResource(), 256 * MIB), 10, 18
    ),
    "cuda_async": lambda: mr.CudaAsyncMemoryResource(),
}


@pytest.fixture(autouse=True)
def _restore_device_resource():
    yield
    _rrmm._clear_per_device_resources()


@pytest.mark.parametrize("streams", ["own", "per_thread", "mixed"])
@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_threads_on_streams_keep_device_buffers_intact(name: str, streams: str) -> None:
    resource = RESOURCES[name]()
    count = 16

    def work(t: int) -> None:
        ptds = streams == "per_thread" or (streams == "mixed" and t % 2 == 1)
        stream = PER_THREAD_DEFAULT_STREAM if ptds else Stream(flags=NON_BLOCKING)
        live: list[tuple[rrmm.DeviceBuffer, bytes]] = []
        for i in range(rounds(150)):
            n = 4 + (i * 7919 + t * 104729) % (MIB + 5)
            if len(live) < 12 and i % 4 != 3:
                data = pattern(t, i, n)
                buf = rrmm.DeviceBuffer.to_device(data, stream=stream, mr=resource)
                if i % 5 == 0:
                    # A stream-ordered copy into a fresh buffer, the source freed at once.
                    buf = buf.copy()
                live.append((buf, data))
            else:
                buf, data = live.pop((i * 31) % len(live))
                got = buf.tobytes(stream=stream)
                assert got == data, f"thread {t}: buffer of {len(data)} bytes corrupted"
        for buf, data in live:
            assert buf.tobytes(stream=stream) == data, f"thread {t}: corrupted at the end"
        stream.synchronize()

    run_threads(count, work)


def test_buffers_cross_threads_and_streams() -> None:
    """A producer thread fills buffers on its stream; consumer threads copy them on theirs."""
    resource = RESOURCES["pool"]()
    made: list[tuple[rrmm.DeviceBuffer, bytes]] = []
    producer_stream = Stream(flags=NON_BLOCKING)
    for i in range(64):
        data = pattern(200, i, 4096 * (i + 1))
        made.append((rrmm.DeviceBuffer.to_device(data, stream=producer_stream, mr=resource), data))
    producer_stream.synchronize()

    def consume(t: int) -> None:
        stream = Stream(flags=NON_BLOCKING)
        for src, data in made[t::8]:
            dst = rrmm.DeviceBuffer(size=src.size, stream=stream, mr=resource)
            dst.copy_from_device(src, stream=stream)
            assert dst.tobytes(stream=stream) == data, f"consumer {t}: copy differs"

    run_threads(8, consume)
    made.clear()
    assert resource.pool_size() >= 256 * MIB


def test_arena_exhaustion_through_device_buffer_then_recovery() -> None:
    arena = mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=64 * MIB)
    held = []
    with pytest.raises(MemoryError):
        for _ in range(65):
            held.append(rrmm.DeviceBuffer(size=MIB, mr=arena))
    assert 32 <= len(held) <= 64
    del held
    data = pattern(1, 1, 48 * MIB)
    buf = rrmm.DeviceBuffer.to_device(data, mr=arena)
    assert buf.tobytes() == data


def test_cupy_hook_from_threads_on_their_streams() -> None:
    """Each thread's last arrays outlive its stream (CuPy destroys the stream at the end of the
    ``with``; the arrays go when the function returns), which CuPy allows. This segfaulted with
    arena and cuda_async: the free went to the destroyed stream's handle. The hooks now free on
    CuPy's current stream once the allocation's stream object is gone, as CuPy's own MemoryAsync
    does."""
    cupy = pytest.importorskip("cupy")
    from rrmm.allocators.cupy import rmm_cupy_allocator, rrmm_cupy_unowned_allocator

    def work(t: int, label: str) -> None:
        with cupy.cuda.Stream(non_blocking=True):
            for i in range(rounds(40)):
                n = 1024 + ((t * 131 + i * 977) % 4096) * 64
                x = cupy.arange(n, dtype=cupy.int64) + t
                y = cupy.empty_like(x)
                y[...] = x * 3
                total = int(y.sum())
                assert total == 3 * (n * (n - 1) // 2 + t * n), f"{label} thread {t}"
            cupy.cuda.get_current_stream().synchronize()

    hooks = {"c": rmm_cupy_allocator, "unowned": rrmm_cupy_unowned_allocator}
    for name in ("arena", "pool", "binning", "cuda_async"):
        for kind, hook in hooks.items():
            mr.set_current_device_resource(RESOURCES[name]())
            previous = cupy.cuda.get_allocator()
            cupy.cuda.set_allocator(hook)
            try:
                run_threads(8, functools.partial(work, label=f"{name} ({kind} hook)"))
                cupy.cuda.Device().synchronize()
            finally:
                cupy.cuda.set_allocator(previous)
                _rrmm._clear_per_device_resources()


def test_cupy_hook_exhaustion_is_memory_error_then_recovery() -> None:
    cupy = pytest.importorskip("cupy")
    from rrmm.allocators.cupy import rmm_cupy_allocator

    arena = mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=64 * MIB)
    mr.set_current_device_resource(arena)
    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        with pytest.raises(MemoryError):
            cupy.empty(128 * MIB, dtype=cupy.uint8)
        x = cupy.full(8 * MIB, 7, dtype=cupy.uint8)
        assert int(x.sum()) == 7 * 8 * MIB
    finally:
        cupy.cuda.set_allocator(previous)


def test_torch_hook_from_threads_on_their_streams() -> None:
    pytest.importorskip("torch")
    code = f"""
    import threading
    import torch
    import rrmm
    from rrmm.allocators.torch import rmm_torch_allocator
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    for resource in (
        rrmm.mr.ArenaMemoryResource(rrmm.mr.CudaMemoryResource(), arena_size=1 << 30),
        rrmm.mr.PoolMemoryResource(rrmm.mr.CudaMemoryResource(), 256 << 20),
    ):
        rrmm.mr.set_current_device_resource(resource)
        errors = []
        def work(t):
            try:
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    for i in range({rounds(30)}):
                        a = torch.randn(256 + t, 128, device="cuda")
                        b = torch.randn(128, 64 + i % 7, device="cuda")
                        c = a @ b
                        ref = a.cpu() @ b.cpu()
                        assert torch.allclose(c.cpu(), ref, rtol=1e-3, atol=1e-3), (t, i)
                s.synchronize()
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        torch.cuda.synchronize()
    print("CHILD OK")
    """
    run_in_child(code, timeout=600)
