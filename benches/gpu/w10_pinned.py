"""W10: pinned host memory, rrmm beside RMM, PyTorch and CuPy, each library in its own process.

Rows: a plain pinned round trip (allocate then free) at 1 MiB and 64 MiB, the same through a
pool over pinned memory, the time until a pool holding 16 GiB of pinned memory is ready, the
host-to-device copy bandwidth from pool memory (256 MiB), and the NUMA node of the pages.

    python3 benches/gpu/w10_pinned.py [--pool-gib 16] [--out w10.jsonl]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import probe_host_managed  # beside this file

MIB = 1 << 20
LIBS = ("rrmm", "rmm", "torch", "cupy")


def median_ns(fn: Callable[[], None], n: int) -> float:
    """The median time of `n` calls of `fn`, after one call to warm up."""
    fn()
    return probe_host_managed.median_ns(fn, n)


def page_node(ptr: int) -> int | None:
    """The NUMA node of the page at `ptr` (move_pages with nodes=NULL), None if unknown."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    page = ptr & ~(os.sysconf("SC_PAGE_SIZE") - 1)
    addrs = (ctypes.c_void_p * 1)(page)
    status = (ctypes.c_int * 1)(-1)
    rc = libc.syscall(279, 0, ctypes.c_ulong(1), addrs, None, status, 0)  # x86-64 move_pages
    return status[0] if rc == 0 and status[0] >= 0 else None


def h2d_gbps(host_ptr: int, nbytes: int) -> float:
    import cupy

    dst = cupy.empty(nbytes, dtype=cupy.uint8)
    rt = cupy.cuda.runtime
    stream = cupy.cuda.Stream(non_blocking=True)

    def once() -> None:
        rt.memcpyAsync(dst.data.ptr, host_ptr, nbytes, rt.memcpyHostToDevice, stream.ptr)
        stream.synchronize()

    return nbytes / median_ns(once, 7)


def run_lib(lib: str, pool_bytes: int) -> dict[str, Any]:
    import cupy

    cupy.cuda.runtime.setDevice(0)
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(256))  # the context is up for everyone
    out: dict[str, Any] = {"lib": lib}
    if lib in ("rrmm", "rmm"):
        mod = __import__(lib)
        mr = mod.mr
        plain = mr.PinnedHostMemoryResource()
        for name, size, n in (("1MiB", MIB, 41), ("64MiB", 64 * MIB, 9)):
            out[f"plain_{name}_ns"] = median_ns(
                lambda s=size: plain.deallocate(plain.allocate(s), s), n)
        if lib == "rrmm":
            out["numa_node_driver"] = _rrmm_node()
            out["registered_from"] = plain.registered_from
            # Both paths at both sizes, to choose the threshold.
            for path, opts in (("hostalloc", {"registered_from": 1 << 62}),
                               ("registered", {"registered_from": 1})):
                r = mr.PinnedHostMemoryResource(**opts)
                for name, size, n in (("1MiB", MIB, 41), ("64MiB", 64 * MIB, 9)):
                    out[f"{path}_{name}_ns"] = median_ns(
                        lambda s=size, r=r: r.deallocate(r.allocate(s), s), n)
        small = mr.PoolMemoryResource(mr.PinnedHostMemoryResource(), initial_pool_size=256 * MIB)
        for name, size, n in (("1MiB", MIB, 20001), ("64MiB", 64 * MIB, 2001)):
            out[f"pool_{name}_ns"] = median_ns(
                lambda s=size: small.deallocate(small.allocate(s), s), n)
        del small
        t0 = time.perf_counter()
        big = mr.PoolMemoryResource(mr.PinnedHostMemoryResource(), initial_pool_size=pool_bytes)
        out["pool_ready_s"] = time.perf_counter() - t0
        if lib == "rrmm":  # where the start-up went (reserve, madvise, touch, register, ...)
            out["pool_startup"] = big.upstream_mr.startup()
        p = big.allocate(256 * MIB)
        out["h2d_256MiB_GBps"] = h2d_gbps(p, 256 * MIB)
        out["page_node"] = page_node(p)
        big.deallocate(p, 256 * MIB)
        del big
        if lib == "rrmm":
            # The range went back to the process's host page supply: a pool made now (or after
            # rrmm.host_pages.prepare(...) ahead of need) finds it ready.
            t0 = time.perf_counter()
            again = mr.PoolMemoryResource(mr.PinnedHostMemoryResource(),
                                          initial_pool_size=pool_bytes)
            out["pool_ready_from_supply_s"] = time.perf_counter() - t0
            out["pool_startup_from_supply"] = again.upstream_mr.startup()
            del again
            mod.host_pages.give_back()
            print(json.dumps(out), flush=True)  # the rows so far, should the next part fail
            t0 = time.perf_counter()
            exp = mr.ExpandableMemoryResource(pinned_host=True, initial_pool_size=pool_bytes)
            out["expandable_ready_s"] = time.perf_counter() - t0
            p = exp.allocate(256 * MIB)
            out["expandable_h2d_256MiB_GBps"] = h2d_gbps(p, 256 * MIB)
            exp.deallocate(p, 256 * MIB)
            del exp
            out.update(_torch_view_check())
    elif lib == "torch":
        import torch

        torch.cuda.init()
        for name, size, n in (("1MiB", MIB, 20001), ("64MiB", 64 * MIB, 2001)):
            out[f"pool_{name}_ns"] = median_ns(
                lambda s=size: torch.empty(s, dtype=torch.uint8, pin_memory=True), n)
        t0 = time.perf_counter()
        big = torch.empty(pool_bytes, dtype=torch.uint8, pin_memory=True)
        out["pool_ready_s"] = time.perf_counter() - t0
        out["h2d_256MiB_GBps"] = h2d_gbps(big.data_ptr(), 256 * MIB)
        out["page_node"] = page_node(big.data_ptr())
    elif lib == "cupy":
        rt = cupy.cuda.runtime
        for name, size, n in (("1MiB", MIB, 41), ("64MiB", 64 * MIB, 9)):
            out[f"plain_{name}_ns"] = median_ns(lambda s=size: rt.freeHost(rt.hostAlloc(s, 0)), n)
        for name, size, n in (("1MiB", MIB, 20001), ("64MiB", 64 * MIB, 2001)):
            out[f"pool_{name}_ns"] = median_ns(
                lambda s=size: cupy.cuda.alloc_pinned_memory(s), n)
        t0 = time.perf_counter()
        big = cupy.cuda.alloc_pinned_memory(pool_bytes)
        out["pool_ready_s"] = time.perf_counter() - t0
        out["h2d_256MiB_GBps"] = h2d_gbps(big.ptr, 256 * MIB)
        out["page_node"] = page_node(big.ptr)
    return out


def _torch_view_check() -> dict[str, Any]:
    """Whether PyTorch and CUDA see rrmm's pinned memory as pinned, per path."""
    import cupy
    import rrmm

    out: dict[str, Any] = {}
    try:
        import torch
    except ImportError:
        return {"torch": "not installed"}
    torch.cuda.init()  # PyTorch answers is_pinned() only once its CUDA state is up
    for name, size in (("hostalloc", MIB), ("registered", 8 * MIB)):
        hb = rrmm.HostBuffer(size)
        attrs = cupy.cuda.runtime.pointerGetAttributes(hb.ptr)
        out[f"{name}_cuda_type"] = int(attrs.type)
        if sys.version_info >= (3, 12):
            out[f"{name}_torch_is_pinned"] = bool(torch.frombuffer(hb, dtype=torch.uint8)
                                                  .is_pinned())
    out["torch_cuda_initialized"] = torch.cuda.is_initialized()
    return out


def _rrmm_node() -> Any:
    from rrmm import _rrmm

    return list(_rrmm.host_numa_node(0))


ROWS = (
    ("plain_1MiB_ns", "plain pinned round trip, 1 MiB (us)", 1e-3),
    ("plain_64MiB_ns", "plain pinned round trip, 64 MiB (us)", 1e-3),
    ("pool_1MiB_ns", "pool over pinned, round trip 1 MiB (ns)", 1),
    ("pool_64MiB_ns", "pool over pinned, round trip 64 MiB (ns)", 1),
    ("pool_ready_s", "pool holding the pool size, ready after (s)", 1),
    ("h2d_256MiB_GBps", "host-to-device copy from it, 256 MiB (GB/s)", 1),
    ("page_node", "NUMA node of its pages", 1),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pool-gib", type=float, default=16)
    ap.add_argument("--libs", default=",".join(LIBS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    pool_bytes = int(args.pool_gib * (1 << 30))
    if args.one:
        print(json.dumps(run_lib(args.one, pool_bytes)))
        return
    results: dict[str, dict[str, Any]] = {}
    for lib in args.libs.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", lib, "--pool-gib",
                               str(args.pool_gib)], check=False, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            results[lib] = {"lib": lib, "error": (proc.stderr or proc.stdout)[-600:]}
        else:
            results[lib] = json.loads(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results.values())
    print(f"W10 pinned host memory (pool {args.pool_gib:g} GiB), one process per library")
    libs = list(results)
    print(f"{'':46s}" + "".join(f"{lib:>12s}" for lib in libs))
    for key, label, scale in ROWS:
        cells = []
        for lib in libs:
            v = results[lib].get(key)
            cells.append("-" if v is None else (f"{v * scale:.4g}" if key != "page_node"
                                                 else str(v)))
        print(f"{label:46s}" + "".join(f"{c:>12s}" for c in cells))
    r = results.get("rrmm", {})
    for key in ("hostalloc_1MiB_ns", "registered_1MiB_ns", "hostalloc_64MiB_ns",
                "registered_64MiB_ns", "expandable_ready_s", "expandable_h2d_256MiB_GBps",
                "numa_node_driver", "registered_from", "hostalloc_cuda_type",
                "registered_cuda_type", "hostalloc_torch_is_pinned",
                "registered_torch_is_pinned", "torch_cuda_initialized", "pool_startup",
                "pool_ready_from_supply_s", "pool_startup_from_supply"):
        if key in r:
            print(f"rrmm {key}: {r[key]}")
    for lib, res in results.items():
        if "error" in res:
            print(f"{lib}: failed: {res['error']}")


if __name__ == "__main__":
    main()
