"""Benchmark W2 (benchmarks.md): ``DeviceBuffer(size=s)`` then drop, per resource, rrmm vs RMM
(when ``rmm`` is importable) interleaved in one run; prints ns per round trip and the ratio.

Run: ``python tests/python/bench_w2.py`` on a GPU machine. Not a test.
"""

from __future__ import annotations

import statistics
import sys
import time


def make(lib, name):
    m = lib.mr
    if name == "cuda":
        return m.CudaMemoryResource()
    if name == "managed":
        return m.ManagedMemoryResource()
    if name == "cuda_async":
        return m.CudaAsyncMemoryResource()
    if name == "pool":
        return m.PoolMemoryResource(m.CudaMemoryResource(), initial_pool_size=2**31)
    if name == "binning":
        return m.BinningMemoryResource(
            m.PoolMemoryResource(m.CudaMemoryResource(), initial_pool_size=2**31), 18, 22
        )
    raise ValueError(name)


def per_op(lib, size, n):
    DB = lib.DeviceBuffer
    for _ in range(min(n, 1000)):
        DB(size=size)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        DB(size=size)
    return (time.perf_counter_ns() - t0) / n


def main() -> int:
    import rrmm

    libs = {"rrmm": rrmm}
    try:
        import rmm

        libs["rmm"] = rmm
    except ImportError:
        print("rmm not importable: rrmm only")
    rows = []
    for name in ["pool", "binning", "cuda_async", "cuda", "managed"]:
        for size in [1 << 10, 1 << 20, 64 << 20]:
            n = 20000 if name in ("pool", "binning", "cuda_async") else 2000
            results = {k: [] for k in libs}
            mrs = {k: make(lib, name) for k, lib in libs.items()}
            for _ in range(5):
                for k, lib in libs.items():
                    lib.mr.set_current_device_resource(mrs[k])
                    results[k].append(per_op(lib, size, n))
            med = {k: statistics.median(v) for k, v in results.items()}
            ratio = med["rrmm"] / med["rmm"] if "rmm" in med else float("nan")
            rows.append((name, size, med.get("rrmm"), med.get("rmm", float("nan")), ratio))
            print(
                f"{name:10s} {size:>10d} rrmm {med['rrmm']:10.0f} ns  rmm {med.get('rmm', float('nan')):10.0f} ns  ratio {ratio:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
