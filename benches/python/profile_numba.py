"""Where the time of Numba's device_array goes with rrmm's EMM plugin (W6 profile).

    python benches/python/profile_numba.py [--iters N] [--reps R] [--json out.json]

Times, in ns per call (median over interleaved passes of the median of R repetitions of N calls,
each object dropped at once):
  device_array      numba.cuda.device_array(1 MiB) through rrmm's plugin over an rrmm pool
  floor             device_array with a memalloc that returns one preallocated pointer
                    (Numba's own cost, which no plugin can remove)
  memalloc          the plugin's memalloc + drop (what rrmm adds to the floor)
  hook_allocate     rrmm's allocation + free alone (Rust: per-device lookup, pool)
  CUdeviceptr       making the pointer object Numba wants
"""

import argparse
import json
import statistics
import time


def timed(body, iters, reps):
    body(iters // 10)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        body(iters)
        out.append((time.perf_counter_ns() - t0) / iters)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--passes", type=int, default=3, help="interleaved passes over the cases")
    p.add_argument("--json")
    a = p.parse_args()

    import numpy as np
    import rrmm
    from numba import cuda
    from rrmm import _rrmm
    from rrmm.allocators import numba as hook

    cuda.set_memory_manager(hook.RMMNumbaManager)
    rrmm.mr.set_current_device_resource(
        rrmm.mr.PoolMemoryResource(rrmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
    )
    ctx = cuda.current_context()
    mm = ctx.memory_manager
    n, u8, device = 1 << 20, np.uint8, mm._device
    device_array, memalloc, allocate = cuda.device_array, mm.memalloc, _rrmm.hook_allocate
    device_ptr = hook._device_ptr

    def arrays(k):
        for _ in range(k):
            device_array(n, dtype=u8)

    def allocs(k):
        for _ in range(k):
            memalloc(n)

    def hooks(k):
        for _ in range(k):
            allocate(n, 0, device)

    def pointers(k):
        for _ in range(k):
            device_ptr(0x7F0000001000)

    fixed = memalloc(n)

    def floor_arrays(k):
        mm.memalloc = lambda size: fixed
        try:
            arrays(k)
        finally:
            del mm.memalloc

    cases = {
        "floor": floor_arrays,
        "device_array": arrays,
        "memalloc": allocs,
        "hook_allocate": hooks,
        "CUdeviceptr": pointers,
    }
    # Interleaved passes, so that a slow spell of the machine hits every case alike.
    samples = {name: [] for name in cases}
    for _ in range(a.passes):
        for name, body in cases.items():
            samples[name].append(timed(body, a.iters, a.reps))
    cuda.synchronize()
    rows = {name: statistics.median(values) for name, values in samples.items()}

    print("W6 profile (ns per call, median):")
    for name, value in rows.items():
        print(f"  {name:24s} {value:10.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
