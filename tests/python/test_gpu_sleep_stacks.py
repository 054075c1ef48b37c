"""Issue 36 on a GPU: every suballocator over the expandable pool on device memory keeps exactly
its live bytes across a sleep, a discard drops exactly the tagged block (its neighbours in the
same chunk keep every byte), every copy of a sleeping buffer is a RuntimeError that touches
nothing, and CuPy arrays and PyTorch tensors made through the hooks keep their addresses and
bytes across a sleep. The CPU side (host virtual memory, generated cases) is
``test_sleep_stacks.py``; skipped without a GPU."""

from __future__ import annotations

import pickle
from typing import Any

import conftest
import numpy as np
import pytest
import rrmm
from rrmm import _rrmm, mr

pytestmark = pytest.mark.skipif(not conftest.gpu_available(), reason=conftest.gpu_skip_reason())

MiB = 1 << 20

STACKS = {
    "pool": lambda up: mr.PoolMemoryResource(up, 64 * MiB),
    "fixed_size": lambda up: mr.FixedSizeMemoryResource(up, 1 * MiB, 16),
    "binning": lambda up: mr.BinningMemoryResource(up, 12, 22),
    "arena": lambda up: mr.ArenaMemoryResource(up, 256 * MiB),
}


def pattern(size: int, seed: int) -> bytes:
    arr = ((np.arange(size, dtype=np.uint32) * 2654435761 + seed) >> 13).astype(np.uint8)
    return arr.tobytes()


@pytest.mark.parametrize("kind", sorted(STACKS))
@pytest.mark.parametrize("size", [4096, 300_000])
def test_gpu_a_discard_between_two_blocks_keeps_both_neighbours(kind: str, size: int) -> None:
    pool = mr.ExpandableMemoryResource()
    top = mr.StatisticsResourceAdaptor(STACKS[kind](pool))
    data = [pattern(size, s) for s in range(3)]
    a, b, c = (rrmm.DeviceBuffer.to_device(d, mr=top) for d in data)
    assert a.ptr < b.ptr < c.ptr or kind == "arena", (a.ptr, b.ptr, c.ptr)
    ptrs = [a.ptr, b.ptr, c.ptr]
    with rrmm.sleep(top, discard=[b], discard_fill="zero") as did:
        assert pool.asleep and pool.mapped_bytes() == 0
        assert did["discarded_bytes"] >= size and did["copied_bytes"] >= 2 * size
        # A chunk is offloaded as its live blocks: never a whole chunk of the suballocator.
        assert did["copied_bytes"] <= 2 * max(size, 1 * MiB if kind == "fixed_size" else 0,
                                              1 << (size - 1).bit_length())
        stats = _rrmm._memory_stats(top)
        if stats is not None:
            assert stats["reserved_bytes.all.current"] == 0
            assert stats["offloaded_bytes.all.current"] > 0
    assert [a.ptr, b.ptr, c.ptr] == ptrs
    assert a.tobytes() == data[0] and c.tobytes() == data[2]
    assert b.tobytes() == bytes(size)
    # This sleep's discard is forgotten: the next sleep keeps b.
    b.copy_from_host(data[1])
    with rrmm.sleep(top) as again:
        assert again["discarded_bytes"] == 0
    assert [x.tobytes() for x in (a, b, c)] == data


@pytest.mark.parametrize("kind", sorted(STACKS))
def test_gpu_every_copy_of_a_sleeping_buffer_is_a_runtime_error(kind: str) -> None:
    pool = mr.ExpandableMemoryResource()
    top = STACKS[kind](pool)
    data = pattern(1 << 20, 7)
    buf = rrmm.DeviceBuffer.to_device(data, mr=top)
    other = rrmm.DeviceBuffer(size=buf.size, mr=mr.CudaMemoryResource())
    host = bytearray(buf.size)
    calls: dict[str, Any] = {
        "copy_to_host": buf.copy_to_host,
        "copy_from_host": lambda: buf.copy_from_host(data),
        "tobytes": buf.tobytes,
        "bytes": lambda: bytes(buf),
        "pickle": lambda: pickle.dumps(buf),
        "pickle5": lambda: pickle.dumps(buf, protocol=5),
        "copy_from_device (into it)": lambda: buf.copy_from_device(other),
        "copy_from_device (out of it)": lambda: other.copy_from_device(buf),
        "copy_ptr_to_host": lambda: _rrmm.copy_ptr_to_host(buf.ptr, host),
        "copy_device_to_ptr": lambda: _rrmm.copy_device_to_ptr(buf.ptr, other.ptr, buf.size),
    }
    with rrmm.sleep(top):
        for name, call in calls.items():
            with pytest.raises(RuntimeError, match="asleep"):
                call()
            assert pool.asleep, name
        with pytest.raises(RuntimeError, match="asleep"):
            rrmm.DeviceBuffer(size=256, mr=top)
    assert buf.tobytes() == data
    other.copy_from_device(buf)
    assert other.tobytes() == data


def test_gpu_cupy_arrays_through_the_hook_keep_addresses_and_bytes() -> None:
    cupy = pytest.importorskip("cupy")
    from rrmm.allocators.cupy import rmm_cupy_allocator

    rrmm.reinitialize(pool_allocator="expandable")
    before = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        keep = cupy.arange(50_000_000, dtype=cupy.int32)
        drop = cupy.ones(10_000_000, dtype=cupy.float32)
        tail = cupy.full(1000, 7, dtype=cupy.int64)
        ptrs = [x.data.ptr for x in (keep, drop, tail)]
        cupy.cuda.runtime.deviceSynchronize()
        with rrmm.sleep(discard=[drop], discard_fill="zero") as did:
            assert did["discarded_bytes"] >= drop.nbytes
            with pytest.raises(RuntimeError, match="asleep"):
                rrmm.DeviceBuffer(size=256)
        assert [x.data.ptr for x in (keep, drop, tail)] == ptrs
        assert int(keep[-1]) == 49_999_999 and bool((keep[:1000] == cupy.arange(1000)).all())
        assert int(drop.sum()) == 0
        assert int(tail.sum()) == 7000
        keep += 1
        assert int(keep[0]) == 1
    finally:
        cupy.cuda.set_allocator(before)
        del keep, drop, tail
        _rrmm._clear_per_device_resources()


def test_gpu_torch_tensors_through_the_hook_keep_addresses_and_bytes() -> None:
    pytest.importorskip("torch")
    out = conftest.run_fresh(
        """
import torch, rrmm
from rrmm.allocators.torch import rmm_torch_allocator
rrmm.reinitialize(pool_allocator="expandable")
torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
torch.manual_seed(0)
w = torch.randn(4096, 4096, device="cuda")
kv = torch.ones(8 << 20, device="cuda")
x = torch.randn(64, 4096, device="cuda")
want = (x @ w).cpu()
ptrs = [t.data_ptr() for t in (w, kv, x)]
torch.cuda.synchronize()
with rrmm.sleep(discard=[kv], discard_fill="zero") as did:
    assert did["discarded_bytes"] >= kv.numel() * 4, did
assert [t.data_ptr() for t in (w, kv, x)] == ptrs
assert torch.equal((x @ w).cpu(), want)
assert float(kv.sum()) == 0.0
print("OK")
""",
        timeout=240,
    )
    assert "OK" in out
