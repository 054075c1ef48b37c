"""Issue 39 on a GPU: after ``reinitialize(pool_allocator=True)`` (an initial pool of about half
the device, all of it free), one CuPy array of 60% of the device is served (RMM refuses it).
Prints one JSON line."""

from __future__ import annotations

import json

import cupy
import rrmm
import rrmm.allocators.cupy

rrmm.reinitialize(pool_allocator=True)
cupy.cuda.set_allocator(rrmm.allocators.cupy.rmm_cupy_allocator)
free, total = cupy.cuda.runtime.memGetInfo()
pool = rrmm.mr.get_current_device_resource()
held_before = pool.pool_size() if hasattr(pool, "pool_size") else None
n = int(total * 0.6) // 4 * 4
row: dict[str, object] = {"device_bytes": total, "request_bytes": n, "pool_before": held_before}
try:
    a = cupy.ones(n // 4, dtype=cupy.float32)
    row["served"] = True
    row["sum_ok"] = bool(float(a.sum()) == n // 4)
    row["pool_after"] = pool.pool_size() if hasattr(pool, "pool_size") else None
except MemoryError as e:
    row["served"] = False
    row["error"] = str(e)[-600:]
print(json.dumps(row), flush=True)
