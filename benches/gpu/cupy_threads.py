"""Reproducer for the CuPy hook from several threads, each on its own non-blocking CuPy stream.

Usage: python cupy_threads.py RESOURCE VARIANT [THREADS]
  RESOURCE: pool, arena, cuda, cuda_async, binning
  VARIANT: late  (arrays outlive their stream: freed after the stream is destroyed)
           early (arrays freed and the stream synchronized before it is destroyed)
           keep  (streams kept alive until every thread has finished)
Exit status 0 and "OK" when every thread checked its data.
"""

from __future__ import annotations

import faulthandler
import sys
import threading

faulthandler.enable()

import cupy
import rrmm
from rrmm.allocators.cupy import rmm_cupy_allocator

MIB = 1 << 20


def make(name: str):
    mr = rrmm.mr
    if name == "pool":
        return mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=256 * MIB)
    if name == "arena":
        return mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=256 * MIB)
    if name == "binning":
        pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=256 * MIB)
        return mr.BinningMemoryResource(pool, 10, 22)
    if name == "cuda_async":
        return mr.CudaAsyncMemoryResource()
    return mr.CudaMemoryResource()


def main() -> None:
    resource, variant = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    rrmm.mr.set_current_device_resource(make(resource))
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    kept: list[object] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                for i in range(40):
                    n = 1024 + ((t * 131 + i * 977) % 4096) * 64
                    x = cupy.arange(n, dtype=cupy.int64) + t
                    y = cupy.empty_like(x)
                    y[...] = x * 3
                    total = int(y.sum())
                    assert total == 3 * (n * (n - 1) // 2 + t * n), f"thread {t}"
                stream.synchronize()
                if variant == "early":
                    del x, y
                    stream.synchronize()
            if variant == "keep":
                kept.append(stream)
                barrier.wait()
            del stream
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    cupy.cuda.Device().synchronize()
    if errors:
        raise errors[0]
    print("OK", resource, variant)


if __name__ == "__main__":
    main()
