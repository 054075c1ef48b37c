"""GPU tests of rrmm.allocators.numba (skipped without numba-cuda or a GPU).

Numba picks its memory manager when it makes a context, once per process, so every check runs
in a fresh interpreter. Kernels are compiled only where this Numba can compile them.
"""

import os
import subprocess
import sys

import conftest
import pytest

pytest.importorskip("numba", reason="Numba is not installed")
numba_cuda = pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
try:
    _GPU = numba_cuda.is_available()
except Exception:  # noqa: BLE001 (any failure to probe means no usable GPU)
    _GPU = False
if not _GPU:
    pytest.skip("no CUDA device for Numba", allow_module_level=True)


def run_fresh(code, env=None):
    """Runs `code` in a new interpreter; returns its stdout (fails on a non-zero exit)."""
    return conftest.run_fresh(code, timeout=180, env=env)


PRELUDE = """
import gc
import numpy as np
from numba import cuda
import rrmm
from rrmm import _rrmm
from rrmm.allocators.numba import RMMNumbaManager
""" + conftest.HOOK_HELPERS


def test_plugin_interface():
    out = run_fresh(
        PRELUDE
        + """
cuda.set_memory_manager(RMMNumbaManager)
ctx = cuda.current_context()
mm = ctx.memory_manager
assert isinstance(mm, RMMNumbaManager), type(mm)
assert mm.interface_version == 1
free, total = ctx.get_memory_info()
assert 0 < free <= total, (free, total)
print("OK")
"""
    )
    assert "OK" in out


def test_device_arrays_copies_and_statistics():
    out = run_fresh(
        PRELUDE
        + """
cuda.set_memory_manager(RMMNumbaManager)
mr = rrmm_mr("StatisticsResourceAdaptor")
stats = None
if mr is not None:
    stats = mr.StatisticsResourceAdaptor(mr.CudaMemoryResource())
    mr.set_current_device_resource(stats)
host = np.arange(1 << 20, dtype=np.float32)
d = cuda.to_device(host)
e = cuda.device_array_like(d)
e.copy_to_device(d)
back = e.copy_to_host()
assert np.array_equal(back, host)
z = cuda.device_array(0, dtype=np.float32)
assert z.size == 0
if stats is not None:
    assert count(stats, "current_bytes") >= 2 * host.nbytes, stats.allocation_counts
del d, e
gc.collect()
cuda.current_context().deallocations.clear()
if stats is not None:
    assert count(stats, "current_bytes") == 0, stats.allocation_counts
    print("STATS")
print("OK")
"""
    )
    assert "OK" in out


def test_environment_variable_selects_the_plugin():
    out = run_fresh(
        """
from numba import cuda
from rrmm.allocators.numba import RMMNumbaManager
import numpy as np
a = cuda.to_device(np.ones(100))
assert isinstance(cuda.current_context().memory_manager, RMMNumbaManager)
assert a.copy_to_host().sum() == 100
print("OK")
""",
        env={"NUMBA_CUDA_MEMORY_MANAGER": "rrmm.allocators.numba"},
    )
    assert "OK" in out


def test_kernel_if_numba_can_compile():
    out = run_fresh(
        PRELUDE
        + """
cuda.set_memory_manager(RMMNumbaManager)
try:
    @cuda.jit
    def axpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]
    x = cuda.to_device(np.arange(1000, dtype=np.float32))
    y = cuda.to_device(np.ones(1000, dtype=np.float32))
    out = cuda.device_array(1000, dtype=np.float32)
    axpy[8, 128](out, 2.0, x, y)
except Exception as exc:  # this Numba cannot compile (e.g. against NumPy 2.5)
    print("NOCOMPILE", type(exc).__name__, exc)
else:
    assert np.array_equal(out.copy_to_host(), 2 * np.arange(1000, dtype=np.float32) + 1)
    print("OK")
"""
    )
    if "NOCOMPILE" in out:
        pytest.skip("this Numba cannot compile kernels: " + out.strip()[:200])
    assert "OK" in out


def test_ipc_handle_opens_in_another_process():
    code = (
        PRELUDE
        + """
import multiprocessing as mp

def child(handle, queue):
    from numba import cuda
    from rrmm.allocators.numba import RMMNumbaManager
    cuda.set_memory_manager(RMMNumbaManager)
    with handle as arr:
        queue.put(float(arr.copy_to_host().sum()))

if __name__ == "__main__":
    cuda.set_memory_manager(RMMNumbaManager)
    # Two arrays, so that (with a pool) the second one is not at its block's base.
    a = cuda.to_device(np.ones(1000, dtype=np.float64))
    b = cuda.to_device(np.full(5000, 2.0))
    handle = b.get_ipc_handle()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=child, args=(handle, queue))
    p.start()
    total = queue.get(timeout=120)
    p.join(timeout=120)
    assert p.exitcode == 0 and total == 10000.0, (p.exitcode, total)
    print("OK")
"""
    )
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
        path = f.name
    try:
        proc = subprocess.run(
            [sys.executable, path], capture_output=True, text=True, timeout=240, check=False
        )
    finally:
        os.unlink(path)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr
