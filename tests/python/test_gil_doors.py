"""The GIL rule at every door into a resource (docs/design.md, "The GIL").

A pool over a ``CallbackMemoryResource`` grows under its lock, and the callback takes the GIL.
A thread that waits for the pool's lock while holding the GIL then blocks the grower for ever.
Every entry point that may reach such a pool (the CuPy hooks' malloc and free, the unowned CuPy
allocator and its owner's free, the Numba hook, the PyTorch entry points, DeviceBuffer, the
pool's figures and release, the statistics calls) must release the GIL for it, as the resource's
call profile says.

Each door runs in a child interpreter with a timeout, so a deadlock fails one test instead of
hanging the run. CuPy is not needed: a minimal fake ``cupy`` package (the few names the hook
imports) stands in for it, and the CuPy C functions are called through ``ctypes.PYFUNCTYPE``,
which keeps the GIL held across the call, as CuPy's Cython code does.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import run_in_child

FAKE_CUPY = {
    "cupy/__init__.py": "from . import cuda\n",
    "cupy/cuda/__init__.py": textwrap.dedent(
        """
        from . import stream, memory

        def get_current_stream():
            return stream.get_current_stream()
        """
    ),
    "cupy/cuda/stream.py": textwrap.dedent(
        """
        class _Stream:
            ptr = 0

        _DEFAULT = _Stream()

        def get_current_stream():
            return _DEFAULT
        """
    ),
    "cupy/cuda/memory.py": textwrap.dedent(
        """
        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id=-1):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset
        """
    ),
}

# A pool over a slow callback (5 ms per upstream call, GIL released while it sleeps) set as the
# current device's resource, and a thread growing it through DeviceBuffer, as in the report. The
# grower gives the pool's memory back after each round, so the pool grows (the callback runs
# under the pool's lock, where a door holding the GIL deadlocks) all through a door's run: some
# 60 times in 0.4 s. Given back only past 1 GiB, it grew 4 or 5 times, all in the first 25 ms,
# and the doors spun through the rest of 1.5 s for nothing.
SETUP = """
import ctypes, gc, os
sys.path.insert(0, {fake!r})
sim = mr.SimulatedMemoryResource(1 << 46)

def slow_allocate(n, stream):
    time.sleep(0.005)
    return sim.allocate(n, stream)

def slow_deallocate(p, n, stream):
    time.sleep(0.001)
    sim.deallocate(p, n, stream)

cb = mr.CallbackMemoryResource(slow_allocate, slow_deallocate)
pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
mr.set_current_device_resource(pool)
stop = threading.Event()
errors = []

def guarded(work):
    def run():
        try:
            while not stop.is_set():
                work()
        except BaseException as e:
            errors.append(e)
            stop.set()
    return run

def grow():
    bufs = [rrmm.DeviceBuffer(size=32 << 20, mr=pool) for _ in range(4)]
    del bufs
    if len(errors) == 0:
        pool.release()

def run_door(door, seconds=0.4, threads=2):
    workers = [threading.Thread(target=guarded(grow))]
    workers += [threading.Thread(target=guarded(door)) for _ in range(threads)]
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
"""

DOORS = {
    "cupy_c_malloc_and_free": """
        malloc_addr, free_addr = _rrmm.cupy_c_allocator_functions()
        # PYFUNCTYPE: the GIL stays held across the call, as CuPy's Cython call holds it.
        malloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int)(malloc_addr)
        free = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(free_addr)

        def door():
            p = malloc(None, 3 << 20, 0)
            assert p not in (None, 2**64 - 1), p
            free(None, p, 0)

        run_door(door)
        assert _rrmm.cupy_c_live_allocations() == 0
    """,
    "cupy_unowned_allocator_and_owner_free": """
        from rrmm.allocators.cupy import rrmm_cupy_unowned_allocator

        def door():
            m = rrmm_cupy_unowned_allocator(3 << 20)
            m.mem.owner.free()
            m = rrmm_cupy_unowned_allocator(3 << 20)
            del m  # the owner frees on drop

        run_door(door)
    """,
    "numba_hook": """
        def door():
            a = _rrmm.hook_allocate(3 << 20, 0, 0)
            a.free()
            a = _rrmm.hook_allocate(3 << 20, 0, 0)
            del a

        run_door(door)
    """,
    "torch_entry_points": """
        lib = ctypes.PyDLL(_rrmm.__file__)  # PyDLL: the GIL stays held across the call
        alloc = lib.rrmm_torch_allocate
        alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int,
                                                          ctypes.c_void_p]
        free = lib.rrmm_torch_deallocate
        free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_void_p]

        def door():
            p = alloc(3 << 20, 0, None)
            assert p
            free(p, 3 << 20, 0, None)

        run_door(door)
    """,
    "device_buffer": """
        def door():
            b = rrmm.DeviceBuffer(size=3 << 20)
            c = rrmm.DeviceBuffer(size=5 << 20, mr=pool)
            del b, c

        run_door(door)
    """,
    "pool_figures_and_release": """
        def door():
            pool.free_bytes(); pool.largest_free_block(); pool.free_block_count()
            pool.pool_size()
            pool.release()

        # Its own releases made the pool grow 200 times in 1.5 s before the grower gave memory
        # back: it keeps its 1.5 s.
        run_door(door, seconds=1.5)
    """,
    "statistics_and_snapshot": """
        def door():
            _rrmm._memory_stats(pool)
            _rrmm._reset_peak_memory_stats(pool)
            _rrmm._memory_snapshot(pool, 0)
            _rrmm._memory_summary(pool)

        run_door(door)
    """,
}


@pytest.fixture
def fake_cupy(tmp_path: Path) -> Path:
    for name, text in FAKE_CUPY.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("door", list(DOORS), ids=list(DOORS))
def test_no_door_waits_for_a_pool_while_holding_the_gil(door: str, fake_cupy: Path) -> None:
    """A grower inside a Python callback under the pool's lock, two threads through the door:
    every call ends (a deadlock is a timeout of the child)."""
    code = textwrap.dedent(SETUP.format(fake=str(fake_cupy))) + textwrap.dedent(DOORS[door])
    run_in_child(code + "\nprint('CHILD OK')\n", timeout=20)
