"""Probe (issue 28, pinned start-up): can a pinned range be registered in chunks while other
threads still fault in the next chunk, and do copies and kernels that span two adjacent
registrations run at pinned speed and stay correct?

    python3 benches/gpu/probe_pinned_register.py --gib 16 --chunk-mib 1024

One JSON line per measurement. Needs CuPy and a GPU; uses libcuda through ctypes (ctypes drops
the GIL around each call, so registration overlaps the Python threads' page touching).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import threading
import time

import cupy
import numpy as np

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cuda.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_HUGEPAGE = 14
PORTABLE_DEVICEMAP = 0x01 | 0x02


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA error {rc}")


def fresh(nbytes: int) -> tuple[mmap.mmap, int]:
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc.madvise(addr, nbytes, MADV_HUGEPAGE)
    return m, addr


def touch(arr: np.ndarray, lo: int, hi: int, threads: int) -> None:
    """Writes a zero every 4 KiB of arr[lo:hi] from `threads` threads (numpy releases the GIL)."""
    step = max(1, (hi - lo) // threads)
    def part(a: int, b: int) -> None:
        arr[a:b:4096] = 0
    ts = [threading.Thread(target=part, args=(a, min(a + step, hi))) for a in range(lo, hi, step)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def touch_in_order(arr: np.ndarray, n: int, threads: int, stripe: int, done: list[int]) -> None:
    """Threads take stripes in address order from a shared cursor, so the touched front moves up
    the range; `done[0]` is how many stripes were taken."""
    lock = threading.Lock()
    def worker() -> None:
        while True:
            with lock:
                lo = done[0] * stripe
                if lo >= n:
                    return
                done[0] += 1
            arr[lo:min(lo + stripe, n):4096] = 0
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def concurrent_register(n: int, threads: int, head_mib: int) -> tuple[mmap.mmap, int, np.ndarray]:
    """One registration of the whole range, started once the first `head_mib` are touched,
    while the touch threads keep going ahead of it."""
    m, addr = fresh(n)
    arr = np.frombuffer(m, dtype=np.uint8)
    stripe = 64 << 20
    done = [0]
    t0 = time.perf_counter()
    toucher = threading.Thread(target=touch_in_order, args=(arr, n, threads, stripe, done))
    toucher.start()
    while done[0] * stripe < (head_mib << 20) and toucher.is_alive():
        time.sleep(0.0005)
    r0 = time.perf_counter()
    check(cuda.cuMemHostRegister_v2(addr, n, PORTABLE_DEVICEMAP), "register concurrent")
    r1 = time.perf_counter()
    toucher.join()
    t1 = time.perf_counter()
    emit(case="register_while_touching", gib=n >> 30, head_mib=head_mib, head_s=r0 - t0,
         register_s=r1 - r0, touch_done_s=t1 - t0, total_s=max(r1, t1) - t0)
    return m, addr, arr


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--chunk-mib", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--case", choices=["chunks", "concurrent"], default="chunks")
    args = ap.parse_args()
    cupy.cuda.Device(0).use()
    cupy.empty(1)  # context
    n = args.gib << 30
    chunk = args.chunk_mib << 20

    if args.case == "concurrent":
        keep = [concurrent_register(n, args.threads, h) for h in (1024, 4096)]
        m, addr = fresh(n)
        arr = np.frombuffer(m, dtype=np.uint8)
        t0 = time.perf_counter(); touch(arr, 0, n, args.threads); t1 = time.perf_counter()
        check(cuda.cuMemHostRegister_v2(addr, n, PORTABLE_DEVICEMAP), "register")
        t2 = time.perf_counter()
        emit(case="touch_then_register_once", gib=args.gib, touch_s=t1 - t0, register_s=t2 - t1, total_s=t2 - t0)
        _m2, addr2, arr2 = keep[0]
        size = 256 << 20
        dev = cupy.arange(size, dtype=cupy.uint8)
        cupy.cuda.runtime.memcpy(addr2 + n - size, dev.data.ptr, size, 2)
        emit(case="copy_into_concurrently_registered_end", ok=bool((arr2[n - size:] == cupy.asnumpy(dev)).all()))
        return
    # B (first, on the machine's fresh memory): pipelined: threads touch chunk k+1 while chunk k registers (fresh memory).
    m, addr = fresh(n)
    arr = np.frombuffer(m, dtype=np.uint8)
    t0 = time.perf_counter()
    reg_s = 0.0
    touch(arr, 0, min(chunk, n), args.threads)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        nxt = None
        if hi < n:
            nxt = threading.Thread(target=touch, args=(arr, hi, min(hi + chunk, n), args.threads - 1))
            nxt.start()
        r0 = time.perf_counter()
        check(cuda.cuMemHostRegister_v2(addr + lo, hi - lo, PORTABLE_DEVICEMAP), "register chunk")
        reg_s += time.perf_counter() - r0
        if nxt is not None:
            nxt.join()
    t1 = time.perf_counter()
    emit(case="pipelined_chunks", gib=args.gib, chunk_mib=args.chunk_mib, total_s=t1 - t0, register_s=reg_s)

    pipe_m, pipe_addr, pipe_arr = m, addr, arr
    # A (second: the host may have backed these pages already): touch all, then one registration (rrmm today).
    m, addr = fresh(n)
    arr = np.frombuffer(m, dtype=np.uint8)
    t0 = time.perf_counter(); touch(arr, 0, n, args.threads); t1 = time.perf_counter()
    check(cuda.cuMemHostRegister_v2(addr, n, PORTABLE_DEVICEMAP), "register")
    t2 = time.perf_counter()
    emit(case="touch_then_register_once", gib=args.gib, touch_s=t1 - t0, register_s=t2 - t1, total_s=t2 - t0)
    check(cuda.cuMemHostUnregister(addr), "unregister")
    del arr
    m.close()

    m, addr, arr = pipe_m, pipe_addr, pipe_arr
    # C: copies within one registration and across two adjacent ones: speed and bytes.
    size = 256 << 20
    dev = cupy.empty(size, dtype=cupy.uint8)
    s = cupy.cuda.Stream(non_blocking=True)
    for name, off in (("inside_one", chunk // 4), ("across_two", chunk - size // 2)):
        if off + size > n:
            continue
        src = arr[off:off + size]
        src[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)
        for _ in range(2):
            e0 = cupy.cuda.Event(); e1 = cupy.cuda.Event()
            e0.record(s)
            cupy.cuda.runtime.memcpyAsync(dev.data.ptr, addr + off, size, 1, s.ptr)
            e1.record(s); e1.synchronize()
        ms = cupy.cuda.get_elapsed_time(e0, e1)
        ok = bool((cupy.asnumpy(dev) == src).all())
        # device-to-host back into the same span
        e0 = cupy.cuda.Event(); e1 = cupy.cuda.Event()
        dev += 1
        e0.record(s)
        cupy.cuda.runtime.memcpyAsync(addr + off, dev.data.ptr, size, 2, s.ptr)
        e1.record(s); e1.synchronize()
        ms2 = cupy.cuda.get_elapsed_time(e0, e1)
        ok2 = bool((src == (np.arange(size, dtype=np.uint64).astype(np.uint8) + 1)).all())
        # a kernel reading the mapped host memory across the span (UVA pointer)
        mem = cupy.cuda.UnownedMemory(addr + off, size, None)
        view = cupy.ndarray(size, dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
        ksum = int(view.astype(cupy.uint64).sum())
        emit(case=f"copy_{name}", h2d_GBps=size / ms / 1e6, d2h_GBps=size / ms2 / 1e6, h2d_ok=ok,
             d2h_ok=ok2, kernel_sum_ok=ksum == int(src.astype(np.uint64).sum()))
    for lo in range(0, n, chunk):
        cuda.cuMemHostUnregister(addr + lo)


if __name__ == "__main__":
    main()
