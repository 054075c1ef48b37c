"""What each way of placing managed memory costs on this GPU (no rrmm needed): the measurements
behind the managed setups' design beyond and within VRAM (issue 28). Each case runs in its own
process, allocates `--gib` GiB, writes it once with a CuPy kernel (fill) and reads it three times
(sum), and prints one JSON line; a table last.

    python3 probe_placement.py [--gib 8] [--only NAME,...]

Cases: device memory (the reference), managed memory with no advice (RMM's), prefetched to the
device, advised to prefer the device (with and without accessed-by), populated by a memset, kept
on the host and mapped (advice only, or populated by a prefetch to the CPU or by host threads),
pinned host memory mapped for the device, and the link and device bandwidths.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import threading
import time
from typing import Any

GIB = 1 << 30
ADVISE_PREFERRED = 3
ADVISE_ACCESSED_BY = 5
CPU = -1
LAST_PREFETCH = 4  # CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION


def driver() -> Any:
    cu = ctypes.CDLL("libcuda.so.1")
    for name in ("cuMemAllocManaged", "cuMemAdvise", "cuMemPrefetchAsync", "cuMemsetD8Async",
                 "cuMemFree", "cuMemRangeGetAttribute"):
        getattr(cu, name).restype = ctypes.c_int
    return cu


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA error {rc}")


def sync() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


def timed(fn: Any) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def as_array(ptr: int, nbytes: int) -> Any:
    import cupy

    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
    return cupy.ndarray((nbytes // 4,), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))


def host_touch(ptr: int, nbytes: int, threads: int = 16, write: bool = True,
               stride: int = 4096) -> None:
    import numpy as np

    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    arr = np.frombuffer(buf, dtype=np.uint8)
    step = nbytes // threads

    def work(i: int) -> None:
        if write:
            arr[i * step:(i + 1) * step:stride] = 0
        else:
            int(arr[i * step:(i + 1) * step:stride].sum())

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def run_case(name: str, gib: float) -> dict[str, Any]:
    import cupy

    nbytes = int(gib * GIB) // 4096 * 4096
    cupy.arange(1024, dtype=cupy.float32).sum()  # kernels compiled (cached on disk)
    (cupy.ones(1024, dtype=cupy.float32)).fill(2.0)
    sync()
    cu = driver()
    out: dict[str, Any] = {"case": name, "gib": gib}
    dev = cupy.cuda.Device().id
    ptr = ctypes.c_uint64()
    prep = 0.0
    t0 = time.perf_counter()
    if name == "device":
        mem = cupy.cuda.Memory(nbytes)
        p = mem.ptr
    elif name == "pinned_mapped":
        host = cupy.cuda.alloc_pinned_memory(nbytes)
        p = host.ptr
    else:
        check(cu.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(nbytes), 1), "alloc")
        p = ptr.value
        size = ctypes.c_size_t(nbytes)
        if name == "m_prefetch_dev":
            check(cu.cuMemPrefetchAsync(ctypes.c_uint64(p), size, dev, None), "prefetch")
        elif name in ("m_pref_dev", "m_pref_dev_ab", "m_pref_dev_memset"):
            check(cu.cuMemAdvise(ctypes.c_uint64(p), size, ADVISE_PREFERRED, dev), "advise")
            if name == "m_pref_dev_ab":
                check(cu.cuMemAdvise(ctypes.c_uint64(p), size, ADVISE_ACCESSED_BY, dev), "ab")
            if name == "m_pref_dev_memset":
                check(cu.cuMemsetD8Async(ctypes.c_uint64(p), 0, size, None), "memset")
        elif name.startswith("m_host"):
            check(cu.cuMemAdvise(ctypes.c_uint64(p), size, ADVISE_PREFERRED, CPU), "advise")
            check(cu.cuMemAdvise(ctypes.c_uint64(p), size, ADVISE_ACCESSED_BY, dev), "ab")
            if name == "m_host_prefetch_cpu":
                check(cu.cuMemPrefetchAsync(ctypes.c_uint64(p), size, CPU, None), "prefetch")
            elif name == "m_host_touch":
                host_touch(p, nbytes)
            elif name == "m_host_touch_read":
                host_touch(p, nbytes, write=False)
            elif name.startswith("m_host_touch_"):  # m_host_touch_<threads>_<stride KiB>
                _, _, _, threads, stride_kib = name.split("_")
                host_touch(p, nbytes, threads=int(threads), stride=int(stride_kib) * 1024)
    sync()
    prep = time.perf_counter() - t0
    out["prep_s"] = round(prep, 4)
    if name.startswith("m_"):
        loc = ctypes.c_int(99)
        rc = cu.cuMemRangeGetAttribute(ctypes.byref(loc), ctypes.c_size_t(4), LAST_PREFETCH,
                                       ctypes.c_uint64(p), ctypes.c_size_t(4096))
        out["last_prefetch"] = loc.value if rc == 0 else f"err {rc}"
    a = as_array(p, nbytes)
    out["fill_s"] = round(timed(lambda: a.fill(1.0)), 4)
    sums = []
    for _ in range(3):
        sums.append(round(timed(lambda: float(a.sum())), 4))
    out["sum_s"] = sums
    out["fill_GBps"] = round(nbytes / out["fill_s"] / 1e9, 1)
    out["sum1_GBps"] = round(nbytes / sums[0] / 1e9, 1)
    out["sum3_GBps"] = round(nbytes / sums[2] / 1e9, 1)
    return out


def run_bandwidth() -> dict[str, Any]:
    import cupy

    n = 4 * GIB
    h = cupy.cuda.alloc_pinned_memory(n)
    d = cupy.cuda.Memory(n)
    d2 = cupy.cuda.Memory(n)
    rt = cupy.cuda.runtime
    for _ in range(2):
        rt.memcpy(d.ptr, h.ptr, n, 1)
    h2d = min(timed(lambda: rt.memcpy(d.ptr, h.ptr, n, 1)) for _ in range(3))
    d2h = min(timed(lambda: rt.memcpy(h.ptr, d.ptr, n, 2)) for _ in range(3))
    d2d = min(timed(lambda: rt.memcpy(d2.ptr, d.ptr, n, 3)) for _ in range(3))
    return {"case": "bandwidth", "h2d_GBps": round(n / h2d / 1e9, 1),
            "d2h_GBps": round(n / d2h / 1e9, 1),
            "d2d_GBps_read_plus_write": round(2 * n / d2d / 1e9, 1)}


CASES = ["device", "m_none", "m_prefetch_dev", "m_pref_dev", "m_pref_dev_ab", "m_pref_dev_memset",
         "m_host", "m_host_prefetch_cpu", "m_host_touch", "m_host_touch_read", "pinned_mapped"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--case", default="")
    args = ap.parse_args()
    if args.case:
        res = run_bandwidth() if args.case == "bandwidth" else run_case(args.case, args.gib)
        print(json.dumps(res), flush=True)
        return
    names = [c for c in (args.only.split(",") if args.only else ["bandwidth", *CASES]) if c]
    rows = []
    for name in names:
        try:
            p = subprocess.run([sys.executable, __file__, "--case", name, "--gib", str(args.gib)],
                               check=False, capture_output=True, text=True, timeout=300)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(line[-1]) if line else {"case": name, "error": p.stderr[-400:]}
        except subprocess.TimeoutExpired:
            row = {"case": name, "error": "timeout 300 s"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{'case':22} {'prep s':>8} {'fill s':>8} {'sum s (x3)':>24} {'fill GB/s':>10} "
          f"{'sum1 GB/s':>10} {'sum3 GB/s':>10} last_prefetch")
    for r in rows:
        if "fill_s" in r:
            print(f"{r['case']:22} {r['prep_s']:8.3f} {r['fill_s']:8.3f} {r['sum_s']!s:>24} "
                  f"{r['fill_GBps']:10} {r['sum1_GBps']:10} {r['sum3_GBps']:10} "
                  f"{r.get('last_prefetch', '')}")
        else:
            print(r)


if __name__ == "__main__":
    main()
