"""Issue 46 on a GPU: memory that moves has one owner, the pool, and every mover goes through
it. Skipped without a GPU; the CPU side (real bytes on a pretend device, generated cases with
the movers interleaved) is ``test_movers_model.py``.

- a ledger sleep of tens of GiB of CuPy arrays with ``declare_busy()`` called 0-200 ms into it:
  every kernel after ``declare_busy()`` returns reads valid data;
- a peer that is stopped (SIGSTOP) costs an allocation at most the ask's deadline;
- a pool built over a tagged resource before a tag was added refuses that tag's sleeping
  memory, and the tag's arrays keep their bytes;
- torch_memory_saver's pause keeps CuPy and PyTorch memory allocated outside its regions;
- a spilling pool whose sleep cannot get host room keeps every byte, and a sleep copies only
  its device pages (spilled pages stay where they are).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conftest
import pytest
import rrmm
from rrmm import _rrmm, mr

pytestmark = pytest.mark.skipif(not conftest.gpu_available(), reason=conftest.gpu_skip_reason())

GiB = 1 << 30


def cupy_mod() -> Any:
    return pytest.importorskip("cupy")


def array_on(pool: Any, nbytes: int, seed: int) -> Any:
    """A uint32 CuPy array of `nbytes` over an allocation of `pool`, filled from `seed`."""
    cupy = cupy_mod()
    ptr = pool.allocate(nbytes)
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
    a = cupy.ndarray((nbytes // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    a[...] = cupy.arange(nbytes // 4, dtype=cupy.uint32) * 2654435761 + seed
    return a


def expected_sum(nbytes: int, seed: int) -> int:
    cupy = cupy_mod()
    return int((cupy.arange(nbytes // 4, dtype=cupy.uint32) * 2654435761 + seed).sum())


@pytest.fixture
def clean_device() -> Iterator[None]:
    cupy = cupy_mod()
    warm = cupy.arange(1 << 20, dtype=cupy.uint32)
    int(warm.sum())
    del warm
    torch = sys.modules.get("torch")
    if torch is not None:
        # An earlier test's tensors cached by PyTorch: a device-full test sized around them
        # would find them given back by rrmm's out-of-memory door instead of spilling.
        torch.cuda.empty_cache()
    yield
    _rrmm._clear_per_device_resources()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.cuda.Device().synchronize()


PEER = r"""
import os, sys, time
import rrmm
rrmm.reinitialize(pool_allocator="expandable", share_gpu={"directory": sys.argv[1],
                  "soft_share": 1 << 30, "name": "asker"})
print("asking", flush=True)
report = rrmm.shared_gpu.ask(int(sys.argv[2]))
print("asked", report.get("slept"), report.get("seconds"), flush=True)
"""


@pytest.mark.parametrize("busy_after_ms", [0, 50, 100, 200])
def test_gpu_busy_during_a_ledger_sleep_leaves_every_array_valid(
    clean_device: None, tmp_path: Path, busy_after_ms: int
) -> None:
    cupy = cupy_mod()
    directory = tmp_path / "ledger"
    directory.mkdir(mode=0o700)
    rrmm.reinitialize(pool_allocator="expandable",
                      share_gpu={"directory": str(directory), "soft_share": 1, "name": "idle"})
    pool = mr.get_current_device_resource()
    free, _total = cupy.cuda.runtime.memGetInfo()
    per = 2 * GiB
    count = max(1, min(20, int(free * 0.35) // per))
    arrays = [array_on(pool, per, seed) for seed in range(count)]
    sums = [expected_sum(per, seed) for seed in range(count)]
    cupy.cuda.Device().synchronize()
    rrmm.shared_gpu.declare_idle()
    free_now, _ = cupy.cuda.runtime.memGetInfo()
    # The peer asks for more than the device has free: this idle process above its share sleeps.
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(directory), str(free_now + 4 * GiB)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None
        assert peer.stdout.readline().strip() == "asking"
        time.sleep(busy_after_ms / 1000)
        rrmm.shared_gpu.declare_busy()
        states = pool.movement()
        assert all(m["phase"] == "awake" for m in states), states
        # Every kernel after declare_busy() returns reads valid data.
        for a, s in zip(arrays, sums, strict=True):
            assert int(a.sum()) == s
        cupy.cuda.Device().synchronize()
    finally:
        peer.wait(timeout=120)
        rrmm.shared_gpu.leave()
    del arrays


STOPPED_PEER = r"""
import sys, time
import rrmm
rrmm.reinitialize(pool_allocator="expandable", share_gpu={"directory": sys.argv[1],
                  "name": "stopped"})
mr = rrmm.mr.get_current_device_resource()
p = mr.allocate(int(sys.argv[2]))
mr.deallocate(p, int(sys.argv[2]))   # cached: the ledger asks it first
print("ready", flush=True)
time.sleep(600)
"""


def test_gpu_a_stopped_peer_costs_at_most_the_deadline(clean_device: None, tmp_path: Path) -> None:
    cupy = cupy_mod()
    directory = tmp_path / "ledger"
    directory.mkdir(mode=0o700)
    free, _ = cupy.cuda.runtime.memGetInfo()
    cached = int(free * 0.5) // GiB * GiB
    peer = subprocess.Popen([sys.executable, "-c", STOPPED_PEER, str(directory), str(cached)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None
        assert peer.stdout.readline().strip() == "ready"
        os.kill(peer.pid, signal.SIGSTOP)
        rrmm.reinitialize(pool_allocator="expandable",
                          share_gpu={"directory": str(directory), "name": "asker"})
        pool = mr.get_current_device_resource()
        free_now, _ = cupy.cuda.runtime.memGetInfo()
        started = time.monotonic()
        with pytest.raises(MemoryError) as refused:
            pool.allocate(free_now + GiB)
        elapsed = time.monotonic() - started
        assert elapsed < 15, f"{elapsed:.1f} s"
        assert str(peer.pid) in str(refused.value)
        rrmm.shared_gpu.leave()
    finally:
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait()


def test_gpu_a_tag_added_after_a_pool_over_it_is_slept_and_refused(clean_device: None) -> None:
    cupy = cupy_mod()
    first = mr.ExpandableMemoryResource()
    tagged = mr.TaggedMemoryResource(first, "first")
    over = mr.PoolMemoryResource(tagged, 0)
    late = mr.ExpandableMemoryResource()
    tagged.add_tag("late", late)
    previous = tagged.set_current_tag("late")
    kept = array_on(over, GiB, 3)
    cached = over.allocate(GiB)
    tagged.set_current_tag(previous)
    over.deallocate(cached, GiB)
    cupy.cuda.Device().synchronize()
    did = late.offload()
    assert did["copied_bytes"] == GiB, did
    with pytest.raises(RuntimeError, match="asleep"):
        over.allocate(GiB)
    late.restore()
    assert int(kept.sum()) == expected_sum(GiB, 3)
    del kept


def test_gpu_pause_keeps_cupy_and_torch_memory_outside_regions(clean_device: None) -> None:
    cupy = cupy_mod()
    torch = pytest.importorskip("torch")
    from rrmm.allocators.cupy import rmm_cupy_allocator
    from rrmm.compat.torch_memory_saver import TorchMemorySaver

    saver = TorchMemorySaver()
    with saver.region(tag="other"):
        pass
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        outside = cupy.arange(1 << 28, dtype=cupy.uint32) * 7 + 1
        with saver.region(tag="default", enable_cpu_backup=True):
            inside = cupy.arange(1 << 28, dtype=cupy.uint32) * 3 + 2
            with saver.disable():
                disabled = cupy.arange(1 << 28, dtype=cupy.uint32) * 5 + 3
                torch_disabled = torch.arange(1 << 26, device="cuda", dtype=torch.int64) * 11
        torch_outside = torch.arange(1 << 26, device="cuda", dtype=torch.int64) * 13
        sums = [int(x.sum()) for x in (outside, disabled)]
        tsums = [int(t.sum()) for t in (torch_disabled, torch_outside)]
        cupy.cuda.Device().synchronize()
        saver.pause()
        more = cupy.ones(1 << 20, dtype=cupy.uint8)  # outside regions: served while paused
        assert [int(x.sum()) for x in (outside, disabled)] == sums
        assert [int(t.sum()) for t in (torch_disabled, torch_outside)] == tsums
        saver.resume()
        assert int(inside[:10].sum()) == int((cupy.arange(10, dtype=cupy.uint32) * 3 + 2).sum())
        assert int(more.sum()) == 1 << 20
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)


def test_gpu_a_spilling_pools_sleep_without_host_room_keeps_every_byte(clean_device: None) -> None:
    cupy = cupy_mod()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.cuda.Device().synchronize()
    # Earlier tests' pools not yet collected keep free pages that rrmm's out-of-memory door
    # would give back: give them back now, so the 3 GiB left are all the device has.
    gc.collect()
    mr.release_caches()
    free, _ = cupy.cuda.runtime.memGetInfo()
    hog = cupy.cuda.runtime.malloc(free - 3 * GiB)
    try:
        pool = mr.ExpandableMemoryResource(spill_to_host=8 * GiB, page_size=32 << 20)
        arrays = []
        for seed in range(5):
            ptr = pool.allocate(GiB)
            mem = cupy.cuda.UnownedMemory(ptr, GiB, None)
            a = cupy.ndarray((GiB // 4,), dtype=cupy.uint32,
                             memptr=cupy.cuda.MemoryPointer(mem, 0))
            a.fill(seed + 1)  # no temporaries: the device keeps its 3 GiB for the pool
            arrays.append(a)
        cupy.cuda.Device().synchronize()
        spilled = pool.spilled_bytes()
        assert GiB <= spilled < 5 * GiB, spilled
        sums = [(seed + 1) * (GiB // 4) for seed in range(5)]
        assert [int(a.sum()) for a in arrays] == sums
        rrmm.host_pages.give_back()
        _rrmm._host_pages_set_room_cap(0)
        try:
            with pytest.raises(MemoryError):
                pool.offload()
        finally:
            _rrmm._host_pages_set_room_cap(None)
        assert not pool.asleep
        assert [int(a.sum()) for a in arrays] == sums, "a refused sleep changed nothing"
        did = pool.offload()
        # Spilled pages are host memory already: never copied, never asked for.
        assert did["copied_bytes"] <= 5 * GiB - spilled, did
        assert pool.spilled_bytes() == spilled
        pool.restore()
        assert [int(a.sum()) for a in arrays] == sums
        del arrays
    finally:
        cupy.cuda.runtime.free(hog)
