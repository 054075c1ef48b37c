"""Measurements that decide the designs of the pinned and managed resources (run on the GPU
machine, no rrmm needed): how fast pinned memory can be made ready, where it lands (NUMA), what
managed memory costs per call and on first touch. Each probe runs in its own process (a failed
driver call or a fault cannot take the others down) and prints one JSON line; a table last.

    python3 probe_host_managed.py [--pinned-gib 16] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.syscall.restype = ctypes.c_long
MAP_POPULATE = 0x8000
MAP_HUGETLB = 0x40000
MADV_HUGEPAGE = 14
SYS_MOVE_PAGES = 279


def rt() -> Any:
    import cupy

    cupy.cuda.runtime.setDevice(0)
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(256))  # context up
    return cupy.cuda.runtime


def median_ns(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def page_nodes(ptr: int, size: int, samples: int = 64) -> dict[int, int]:
    """NUMA node of `samples` pages spread over [ptr, ptr+size) (move_pages with nodes=NULL)."""
    page = os.sysconf("SC_PAGE_SIZE")
    addrs = (ctypes.c_void_p * samples)(*[ptr + (size // samples) * i // page * page
                                          for i in range(samples)])
    status = (ctypes.c_int * samples)()
    rc = libc.syscall(SYS_MOVE_PAGES, 0, samples, addrs, None, status, 0)
    if rc != 0:
        return {-1: ctypes.get_errno()}
    out: dict[int, int] = {}
    for s in status:
        out[s] = out.get(s, 0) + 1
    return out


def touch_parallel(ptr: int, size: int, threads: int) -> None:
    chunk = (size + threads - 1) // threads
    def work(i: int) -> None:
        start = i * chunk
        n = min(chunk, size - start)
        if n > 0:
            ctypes.memset(ptr + start, 0, n)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def mmap_anon(size: int, flags: int = 0) -> int:
    p = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags, -1, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return p


# ---------------------------------------------------------------- probes (each in a process)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def probe_system(_: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {}
    nodes = sorted(n for n in os.listdir("/sys/devices/system/node") if n.startswith("node"))
    info["numa_nodes"] = nodes
    for n in nodes:
        try:
            info[f"{n}_cpus"] = _read(f"/sys/devices/system/node/{n}/cpulist").strip()
        except OSError:
            pass
    for f in ("enabled", "defrag"):
        try:
            info[f"thp_{f}"] = _read(f"/sys/kernel/mm/transparent_hugepage/{f}").strip()
        except OSError:
            info[f"thp_{f}"] = None
    mem = _read("/proc/meminfo").splitlines()
    info["meminfo"] = [ln for ln in mem if ln.split(":")[0] in
                       ("MemTotal", "MemFree", "MemAvailable", "HugePages_Total", "Hugepagesize")]
    info["cpus"] = os.cpu_count()
    info["kernel"] = os.uname().release
    r = rt()
    for name, attr in (("host_numa_id", 134), ("numa_config", 130), ("numa_id", 131),
                       ("pageable_access", 88), ("concurrent_managed", 89),
                       ("host_register_supported", 99), ("pageable_uses_host_pt", 100)):
        try:
            info[f"attr_{name}"] = r.deviceGetAttribute(attr, 0)
        except Exception as e:  # noqa: BLE001
            info[f"attr_{name}"] = repr(e)
    free, total = r.memGetInfo()
    info["gpu_free_total"] = [free, total]
    return info


def probe_pinned_roundtrip(_: argparse.Namespace) -> dict[str, Any]:
    r = rt()
    out: dict[str, Any] = {}
    for size_name, size in (("1MiB", MIB), ("64MiB", 64 * MIB)):
        for flags_name, flags in (("default", 0), ("portable", 1)):
            def rt_once(size: int = size, flags: int = flags) -> None:
                r.freeHost(r.hostAlloc(size, flags))
            rt_once()
            out[f"hostAlloc_{flags_name}_{size_name}_ns"] = median_ns(rt_once, 21 if size == MIB
                                                                      else 5)
        def reg_once(size: int = size) -> None:
            p = mmap_anon(size)
            touch_parallel(p, size, 1)
            r.hostRegister(p, size, 0)
            r.hostUnregister(p)
            libc.munmap(p, size)
        reg_once()
        out[f"mmap_touch_register_{size_name}_ns"] = median_ns(reg_once, 21 if size == MIB else 5)
    for modname in ("rmm", "rrmm"):
        try:
            mod = __import__(modname)
        except ImportError:
            out[modname] = "not installed"
            continue
        mr = mod.mr.PinnedHostMemoryResource()
        for size_name, size in (("1MiB", MIB), ("64MiB", 64 * MIB)):
            def lib_once(size: int = size, mr: Any = mr) -> None:
                mr.deallocate(mr.allocate(size), size)
            lib_once()
            out[f"{modname}_pinned_{size_name}_ns"] = median_ns(lib_once, 21 if size == MIB else 5)
    return out


def _ready(method: str, size: int, threads: int) -> dict[str, Any]:
    r = rt()
    t0 = time.perf_counter()
    if method == "hostAlloc":
        p = r.hostAlloc(size, 0)
        t1 = time.perf_counter()
        nodes = page_nodes(p, size)
        r.freeHost(p)
        return {"seconds": t1 - t0, "nodes": nodes}
    if method.startswith("mmap"):
        flags = MAP_POPULATE if "populate" in method else 0
        p = mmap_anon(size, flags)
        if "thp" in method:
            libc.madvise(p, size, MADV_HUGEPAGE)
        t_map = time.perf_counter()
        if "touch" in method:
            touch_parallel(p, size, threads)
        t_touch = time.perf_counter()
        r.hostRegister(p, size, 0)
        t1 = time.perf_counter()
        nodes = page_nodes(p, size)
        r.hostUnregister(p)
        libc.munmap(p, size)
        return {"seconds": t1 - t0, "map": t_map - t0, "touch": t_touch - t_map,
                "register": t1 - t_touch, "nodes": nodes}
    if method == "vmm_host_numa":
        from cuda.bindings import driver as d

        numa = r.deviceGetAttribute(134, 0)
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        prop.location.id = max(numa, 0)
        err, gran = d.cuMemGetAllocationGranularity(
            prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        if err != d.CUresult.CUDA_SUCCESS:
            return {"error": f"granularity {err}"}
        size = (size + gran - 1) // gran * gran
        err, handle = d.cuMemCreate(size, prop, 0)
        if err != d.CUresult.CUDA_SUCCESS:
            return {"error": f"cuMemCreate {err}"}
        t_create = time.perf_counter()
        err, va = d.cuMemAddressReserve(size, 0, 0, 0)
        err2, = d.cuMemMap(va, size, 0, handle, 0)
        descs = []
        for loc_type, loc_id in ((d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, 0),
                                 (d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA,
                                  max(numa, 0))):
            desc = d.CUmemAccessDesc()
            desc.location.type = loc_type
            desc.location.id = loc_id
            desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            descs.append(desc)
        err3, = d.cuMemSetAccess(va, size, descs, len(descs))
        t1 = time.perf_counter()
        res: dict[str, Any] = {"seconds": t1 - t0, "create": t_create - t0,
                               "map_access": t1 - t_create, "granularity": gran,
                               "errors": [str(err), str(err2), str(err3)]}
        if err3 == d.CUresult.CUDA_SUCCESS:
            t2 = time.perf_counter()
            touch_parallel(int(va), min(size, GIB), 8)
            res["cpu_touch_1GiB"] = time.perf_counter() - t2
            res["nodes"] = page_nodes(int(va), size)
        d.cuMemUnmap(va, size)
        d.cuMemAddressFree(va, size)
        d.cuMemRelease(handle)
        return res
    raise ValueError(method)


def probe_pinned_ready(args: argparse.Namespace) -> dict[str, Any]:
    size = args.pinned_gib * GIB
    out: dict[str, Any] = {}
    for rep in range(2):
        for method in args.methods.split(","):
            try:
                out[f"{method}#{rep}"] = _ready(method, size, args.threads)
            except Exception as e:  # noqa: BLE001
                out[f"{method}#{rep}"] = {"error": repr(e)}
            print(json.dumps({method: out[f"{method}#{rep}"]}), file=sys.stderr, flush=True)
    return out


def probe_managed(_: argparse.Namespace) -> dict[str, Any]:
    import cupy

    r = rt()
    out: dict[str, Any] = {}
    for size_name, size in (("1KiB", 1024), ("1MiB", MIB), ("64MiB", 64 * MIB)):
        def managed_once(size: int = size) -> None:
            r.free(r.mallocManaged(size, 1))
        def device_once(size: int = size) -> None:
            r.free(r.malloc(size))
        managed_once()
        device_once()
        out[f"mallocManaged_free_{size_name}_ns"] = median_ns(managed_once, 51)
        out[f"malloc_free_{size_name}_ns"] = median_ns(device_once, 51)
    # First touch on the GPU: a fill kernel over fresh managed memory, prefetched managed
    # memory, and device memory; then the same kernel again (steady state).
    size = 256 * MIB
    fill = cupy.ElementwiseKernel("", "float32 x", "x = 1.0f", "fill")
    stream = cupy.cuda.Stream.null

    def kernel_time(ptr: int) -> float:
        mem = cupy.cuda.UnownedMemory(ptr, size, None)
        arr = cupy.ndarray((size // 4,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
        stream.synchronize()
        t0 = time.perf_counter()
        fill(arr)
        stream.synchronize()
        return time.perf_counter() - t0

    def prefetch(ptr: int) -> None:
        try:
            r.memPrefetchAsync(ptr, size, 0, 0)
        except TypeError:
            loc = r.MemLocation() if hasattr(r, "MemLocation") else None
            r.memPrefetchAsync(ptr, size, loc, 0, 0)

    for variant in ("device", "managed", "managed_prefetch", "managed_advise_prefetch"):
        try:
            t0 = time.perf_counter()
            ptr = r.malloc(size) if variant == "device" else r.mallocManaged(size, 1)
            if "advise" in variant:
                r.memAdvise(ptr, size, 3, 0)  # cudaMemAdviseSetPreferredLocation
            if "prefetch" in variant:
                prefetch(ptr)
            stream.synchronize()
            t_alloc = time.perf_counter() - t0
            first = kernel_time(ptr)
            second = kernel_time(ptr)
            r.free(ptr)
            out[f"{variant}_256MiB"] = {"alloc_prefetch_s": t_alloc, "first_kernel_s": first,
                                        "second_kernel_s": second}
        except Exception as e:  # noqa: BLE001
            out[f"{variant}_256MiB"] = {"error": repr(e)}
    return out


PROBES = {
    "system": probe_system,
    "pinned_roundtrip": probe_pinned_roundtrip,
    "pinned_ready": probe_pinned_ready,
    "managed": probe_managed,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe")
    ap.add_argument("--only", default=",".join(PROBES))
    ap.add_argument("--pinned-gib", type=int, default=16)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--methods", default="mmap_touch_register,mmap_thp_touch_register,"
                    "mmap_populate_register,mmap_register,hostAlloc,vmm_host_numa")
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps({args.probe: PROBES[args.probe](args)}), flush=True)
        return
    passthrough = ["--pinned-gib", str(args.pinned_gib), "--threads", str(args.threads),
                   "--methods", args.methods]
    for name in args.only.split(","):
        try:
            proc = subprocess.run([sys.executable, __file__, "--probe", name, *passthrough],
                                  check=False, capture_output=True, text=True,
                                  timeout=args.timeout)
            print(proc.stdout.strip() or f'{{"{name}": "no output, rc={proc.returncode}"}}')
            if proc.returncode:
                print(proc.stderr[-2000:])
        except subprocess.TimeoutExpired as e:
            print(json.dumps({name: "timed out"}), (e.stderr or b"")[-2000:])


if __name__ == "__main__":
    main()
