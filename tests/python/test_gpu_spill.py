"""Issue 37 on a GPU: an expandable pool with ``spill_to_host`` maps host pages under its own
addresses once the device is full (CuPy reads and writes them in place), ``promote()`` moves
them to device memory with every address and byte kept, a sleep of a spilled pool keeps every
byte, and a CUDA graph captured on spilled memory gives the same output after promotion. The
CPU side (a pretend device of host memory, generated cases) is ``test_spill.py``; skipped
without a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import conftest
import pytest
from rrmm import mr

pytestmark = pytest.mark.skipif(not conftest.gpu_available(), reason=conftest.gpu_skip_reason())

GiB = 1 << 30


@pytest.fixture
def device_nearly_full() -> Iterator[Any]:
    """Device memory held outside rrmm until 3 GiB stay free; released by `release()`. CuPy's
    own pool keeps the temporaries of the tests' kernels (made here first, cached)."""
    cupy = pytest.importorskip("cupy")
    warm = cupy.arange(GiB // 4, dtype=cupy.uint32) * 2654435761 + 1
    int(warm.sum())
    del warm
    cupy.cuda.Device().synchronize()
    free, _ = cupy.cuda.runtime.memGetInfo()
    hog = [cupy.cuda.runtime.malloc(free - 3 * GiB)]

    class Hog:
        def release(self) -> None:
            while hog:
                cupy.cuda.runtime.free(hog.pop())

    h = Hog()
    yield h
    h.release()


def array_on(pool: mr.ExpandableMemoryResource, nbytes: int, seed: int) -> tuple[Any, Any]:
    cupy = pytest.importorskip("cupy")
    ptr = pool.allocate(nbytes)
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
    a = cupy.ndarray((nbytes // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    a[...] = cupy.arange(nbytes // 4, dtype=cupy.uint32) * 2654435761 + seed
    return ptr, a


def test_gpu_spilled_arrays_promote_with_addresses_and_bytes(device_nearly_full: Any) -> None:
    cupy = pytest.importorskip("cupy")
    pool = mr.ExpandableMemoryResource(spill_to_host=16 * GiB, page_size=32 << 20)
    made = pool.prepare_spill(2 * GiB, threads=4)
    assert made >= 2 * GiB
    arrays = [array_on(pool, GiB, seed) for seed in range(6)]
    cupy.cuda.Device().synchronize()
    spilled = pool.spilled_bytes()
    assert spilled >= 2 * GiB, "6 GiB on a device with 3 GiB free spills"
    sums = [int(a.sum()) for _, a in arrays]
    figures = pool.spill_figures()
    assert figures is not None and figures["spilled"] == spilled
    assert figures["reused"] >= 2 * GiB, "the pages made ahead were used"

    # A graph captured over spilled memory (in-place kernels: no temporaries), run once first.
    stream = cupy.cuda.Stream(non_blocking=True)
    src, dst = arrays[-1][1], arrays[-2][1]
    with stream:
        for capture in (False, True):
            if capture:
                stream.synchronize()
                stream.begin_capture()
            cupy.multiply(src, 3, out=dst)
            cupy.add(dst, 7, out=dst)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    before = int(dst.sum())
    sums[-2] = before

    device_nearly_full.release()
    report = pool.promote()
    assert report["promoted"] == spilled and report["spilled"] == 0
    assert pool.spilled_bytes() == 0
    for (ptr, a), s in zip(arrays, sums, strict=True):
        assert a.data.ptr == ptr
        assert int(a.sum()) == s
    dst[...] = 0
    graph.launch(stream)
    stream.synchronize()
    assert int(dst.sum()) == before
    assert pool.spill_figures()["promoted"] == spilled  # type: ignore[index]
    del graph
    for ptr, _ in arrays:
        pool.deallocate(ptr, GiB)


def test_gpu_promotion_moves_into_the_pools_freed_device_pages(device_nearly_full: Any) -> None:
    """The device stays full (the hog is kept): the room is the pool's own freed arrays, whose
    device pages the promotion takes where they lie (no device memory made); every byte and
    address kept, and the freed addresses serve new arrays after it."""
    cupy = pytest.importorskip("cupy")
    pool = mr.ExpandableMemoryResource(spill_to_host=16 * GiB, page_size=32 << 20)
    arrays = [array_on(pool, GiB, seed) for seed in range(6)]
    cupy.cuda.Device().synchronize()
    spilled = pool.spilled_bytes()
    assert spilled >= 2 * GiB, "6 GiB on a device with 3 GiB free spills"
    on_device = [(p, a) for p, a in arrays[:2]]
    kept = arrays[2:]
    sums = [int(a.sum()) for _, a in kept]
    del arrays
    for ptr, _ in on_device:
        pool.deallocate(ptr, GiB)
    del on_device
    report = pool.promote()
    figures = pool.spill_figures()
    assert figures is not None
    assert report["promoted"] > 0 and figures["promote_reused"] > 0, (report, figures)
    assert figures["promote_reused"] <= report["promoted"]
    for (ptr, a), s in zip(kept, sums, strict=True):
        assert a.data.ptr == ptr
        assert int(a.sum()) == s
    fresh = [array_on(pool, GiB, 100 + seed) for seed in range(2)]
    for (ptr, a), s in zip(kept, sums, strict=True):
        assert int(a.sum()) == s
    for i, (_, a) in enumerate(fresh):
        for at in (0, GiB // 8 + 3, GiB // 4 - 1):
            assert int(a[at]) == (at * 2654435761 + 100 + i) % (1 << 32)
    for ptr, _ in kept + fresh:
        pool.deallocate(ptr, GiB)


def test_gpu_a_spilled_pool_sleeps_and_wakes_with_every_byte(device_nearly_full: Any) -> None:
    cupy = pytest.importorskip("cupy")
    pool = mr.ExpandableMemoryResource(spill_to_host=16 * GiB)
    arrays = [array_on(pool, GiB, 100 + seed) for seed in range(5)]
    cupy.cuda.Device().synchronize()
    assert pool.spilled_bytes() > 0
    sums = [int(a.sum()) for _, a in arrays]
    pool.offload()
    pool.restore()
    assert [int(a.sum()) for _, a in arrays] == sums
    # One buffer's pages, once the device has room.
    device_nearly_full.release()
    ptr, a = arrays[-1]
    pool.promote(ptr)
    assert int(a.sum()) == sums[-1]
    for ptr, _ in arrays:
        pool.deallocate(ptr, GiB)


def test_gpu_reinitialize_with_spill_to_host_builds_the_spilling_pool() -> None:
    import rrmm

    try:
        rrmm.reinitialize(pool_allocator="expandable", spill_to_host="4GiB")
        pool = mr.get_current_device_resource()
        assert isinstance(pool, mr.ExpandableMemoryResource)
        figures = pool.spill_figures()
        assert figures is not None and figures["limit"] == 4 * GiB
        assert pool.promote()["promoted"] == 0
        spill = rrmm.memory_snapshot()["rrmm"]["spill"]
        assert spill is not None and spill["limit"] == 4 * GiB
    finally:
        rrmm.reinitialize()
