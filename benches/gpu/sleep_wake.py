"""Issue 32 on one GPU: an expandable pool sleeps and wakes with every address and byte intact.

    python benches/gpu/sleep_wake.py --part a [--gib 40]   # CuPy arrays: GB/s against the link
    python benches/gpu/sleep_wake.py --part b [--gib 40]   # another process uses the memory
    python benches/gpu/sleep_wake.py --part c              # PyTorch tensors and a CUDA graph

Each part runs in its own process (PyTorch's allocator must be chosen before its first CUDA
allocation) and prints one JSON line on stdout (progress on stderr); run each under
``timeout 600``.

a: ``--gib`` GiB of CuPy arrays (1 GiB each) on ``reinitialize(pool_allocator="expandable")``,
   known data; the link's bandwidth each way from a plain pinned ``cudaMemcpy`` in the same run;
   two sleeps (the host copy kept from the first, so the second makes no host pages), each
   timed whole and by step (``last_sleep()``), with GB/s and the ratio to the link; data and
   addresses checked after each wake, the device's free memory while asleep.
b: the same arrays; while asleep a second process allocates ``--other-gib`` GiB with plain CuPy,
   writes and checks it and exits; then a process holding nearly all the device keeps the pool
   from waking (``restore()`` must raise MemoryError and lose nothing), exits, and the wake
   succeeds; data checked.
d: issue 37, a fresh process with rrmm's defaults: the link measured first; ``--gib`` GiB of
   arrays; ``prepare_sleep(wait=True)`` timed (the host pages made ahead of need, as a program
   would at start-up, off its critical path); then ``--sleeps`` sleeps with no option set, each
   in GB/s and as a share of the link, with ``host_reused`` (pages ready) and the host page
   supply's figures; right after an ``offload()`` returns a second process allocates 90% of
   what it released (the memory is free when the call returns): in one more sleep after the
   timed ones (``--other-check extra``, the default), or after the first timed offload
   (``--other-check first``, as before: the first restore then maps memory the other process
   just gave back, which the driver scrubs, and is slower).
e: the soak: ``--cycles`` sleeps of ``--gib`` GiB with a CUDA graph (CuPy stream capture)
   replayed after every wake; every cycle checks each array's checksum and the graph's output
   against cycle 0, records the device's free memory while asleep, the host memory held (the
   supply's figures and the process's VmRSS) and the cycle's times; the summary says whether
   anything crept.
c: PyTorch tensors from the pool through rrmm's PyTorch hook, a CUDA graph captured on them
   (CuPy stream capture of kernels that write in place: PyTorch's own ``torch.cuda.graph`` asks a
   pluggable allocator for a private pool, which it does not offer), replayed after the wake:
   same addresses, same results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

GIB = 1 << 30


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def expandable_pool() -> Any:
    import rrmm

    rrmm.reinitialize(pool_allocator="expandable")
    return rrmm.mr.get_current_device_resource()


def link_gbps(nbytes: int = 2 * GIB, reps: int = 3) -> dict[str, float]:
    """Device-to-host and host-to-device GB/s of a plain pinned cudaMemcpy (best of ``reps``)."""
    import cupy

    rt = cupy.cuda.runtime
    host = rt.hostAlloc(nbytes, 0)
    dev = rt.malloc(nbytes)
    out: dict[str, float] = {}
    try:
        for name, (dst, src, kind) in {
            "d2h_gbps": (host, dev, rt.memcpyDeviceToHost),
            "h2d_gbps": (dev, host, rt.memcpyHostToDevice),
        }.items():
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                rt.memcpy(dst, src, nbytes, kind)
                best = min(best, time.perf_counter() - t)
            out[name] = nbytes / best / 1e9
    finally:
        rt.free(dev)
        rt.freeHost(host)
    return out


def fill(gib: int) -> list[Any]:
    """``gib`` arrays of 1 GiB, array ``i`` holding ``expected(i)``."""
    import cupy
    import rrmm.allocators.cupy

    cupy.cuda.set_allocator(rrmm.allocators.cupy.rmm_cupy_allocator)
    arrays = [expected(i) for i in range(gib)]
    cupy.cuda.Device().synchronize()
    return arrays


def expected(i: int) -> Any:
    import cupy

    n = GIB // 4
    return cupy.arange(n, dtype=cupy.uint32) * cupy.uint32(2654435761) + cupy.uint32(i)


def check(arrays: list[Any], ptrs: list[int]) -> bool:
    import cupy

    same = [a.data.ptr for a in arrays] == ptrs
    ok = all(bool(cupy.array_equal(a, expected(i))) for i, a in enumerate(arrays))
    return same and ok


def device_free() -> int:
    import cupy

    return int(cupy.cuda.runtime.memGetInfo()[0])


def one_sleep(mr: Any, arrays: list[Any], ptrs: list[int], link: dict[str, float]) -> dict[str, Any]:
    free_awake = device_free()
    t = time.perf_counter()
    did = mr.offload()
    offload_s = time.perf_counter() - t
    free_asleep = device_free()
    t = time.perf_counter()
    mr.restore()
    restore_s = time.perf_counter() - t
    steps = mr.last_sleep() if hasattr(mr, "last_sleep") else None
    copied = did["copied_bytes"]
    row: dict[str, Any] = {
        "copied_bytes": copied,
        "released_bytes": did["released_bytes"],
        "freed_on_device_bytes": free_asleep - free_awake,
        "offload_s": offload_s,
        "restore_s": restore_s,
        "offload_gbps": copied / offload_s / 1e9,
        "restore_gbps": copied / restore_s / 1e9,
        "offload_vs_link": copied / offload_s / 1e9 / link["d2h_gbps"],
        "restore_vs_link": copied / restore_s / 1e9 / link["h2d_gbps"],
        "steps": steps,
        "data_and_addresses_ok": check(arrays, ptrs),
    }
    if steps:
        row["copy_out_vs_link"] = copied / steps["copy_out_s"] / 1e9 / link["d2h_gbps"]
        row["copy_in_vs_link"] = copied / steps["copy_in_s"] / 1e9 / link["h2d_gbps"]
    return row


def part_a(args: argparse.Namespace) -> dict[str, Any]:
    link = link_gbps()
    log("link", link)
    mr = expandable_pool()
    pool = pool_of(mr)
    pool.set_retain_host_copy(True)
    arrays = fill(args.gib)
    ptrs = [a.data.ptr for a in arrays]
    log("filled", args.gib, "GiB; estimate", mr.sleep_estimate())
    first = one_sleep(mr, arrays, ptrs, link)
    log("first", first)
    second = one_sleep(mr, arrays, ptrs, link)
    pool.set_retain_host_copy(False)
    return {"part": "a", "gib": args.gib, "link": link, "first": first, "second": second}


def pool_of(mr: Any) -> Any:
    """The ExpandableMemoryResource under ``mr`` (reinitialize may put adaptors on top)."""
    import rrmm.mr

    while not isinstance(mr, rrmm.mr.ExpandableMemoryResource):
        mr = mr.upstream_mr
    return mr


CHILD = """
import json, sys, cupy
n = int(sys.argv[1])
x = cupy.ones(n, dtype=cupy.uint8)
ok = int(x.sum(dtype=cupy.uint64)) == n
print(json.dumps({"allocated_bytes": n, "ok": ok}), flush=True)
if len(sys.argv) > 2:
    sys.stdin.readline()
"""


def part_b(args: argparse.Namespace) -> dict[str, Any]:
    mr = expandable_pool()
    arrays = fill(args.gib)
    ptrs = [a.data.ptr for a in arrays]
    did = mr.offload()
    free_asleep = device_free()
    log("asleep:", did, "device free", free_asleep)
    other = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.other_gib * GIB)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    other_row = json.loads(other.stdout) if other.returncode == 0 else {"error": other.stderr[-500:]}
    log("other process:", other_row)
    # A process that holds all but 2 GiB: the wake cannot get its memory and must lose nothing.
    hold = max(free_asleep - 2 * GIB, 0)
    holder = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(hold), "wait"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    line = holder.stdout.readline()
    held = json.loads(line) if line.strip() else {"error": "the holder could not allocate"}
    try:
        mr.restore()
        refused = None
    except MemoryError as e:
        refused = str(e)
    still_asleep = mr.asleep
    holder.stdin.write("\n")
    holder.stdin.flush()
    holder.wait(timeout=120)
    if still_asleep:
        mr.restore()
    return {
        "part": "b",
        "gib": args.gib,
        "copied_bytes": did["copied_bytes"],
        "device_free_asleep": free_asleep,
        "other_process": other_row,
        "holder": held,
        "restore_refused": refused,
        "asleep_after_refusal": still_asleep,
        "data_and_addresses_ok": check(arrays, ptrs),
    }


def captured_graph(src: Any, out: Any, stream: Any, times: int, plus: int) -> Any:
    """A CUDA graph (CuPy stream capture) of ``out = src * times + plus``, written in place; run
    once outside the capture first, so the kernels are compiled and loaded before it."""
    import cupy

    with stream:
        for capture in (False, True):
            if capture:
                stream.synchronize()
                stream.begin_capture()
            cupy.multiply(src, times, out=out)
            cupy.add(out, plus, out=out)
        return stream.end_capture()


def part_c(args: argparse.Namespace) -> dict[str, Any]:
    import rrmm.allocators.torch
    import torch

    torch.cuda.memory.change_current_allocator(rrmm.allocators.torch.rmm_torch_allocator)
    mr = expandable_pool()
    import cupy

    n = args.elements
    a = torch.arange(n, device="cuda", dtype=torch.float32)
    b = torch.empty_like(a)
    c = a * 3  # a tensor computed before the sleep
    ca, cb = cupy.asarray(a), cupy.asarray(b)
    stream = cupy.cuda.Stream(non_blocking=True)
    torch.cuda.synchronize()
    graph = captured_graph(ca, cb, stream, times=2, plus=1)
    graph.launch(stream)
    stream.synchronize()
    before = cb.copy()
    ptrs = [a.data_ptr(), b.data_ptr(), c.data_ptr()]
    b.zero_()
    torch.cuda.synchronize()
    free_awake = device_free()
    import rrmm

    with rrmm.sleep(mr) as did:
        freed = device_free() - free_awake
        asleep = mr.asleep
    graph.launch(stream)
    stream.synchronize()
    return {
        "part": "c",
        "elements": n,
        "copied_bytes": did["copied_bytes"],
        "freed_on_device_bytes": freed,
        "asleep_inside": asleep,
        "addresses_same": [a.data_ptr(), b.data_ptr(), c.data_ptr()] == ptrs,
        "tensor_data_same": bool(torch.equal(a, torch.arange(n, device="cuda", dtype=torch.float32))
                                 and torch.equal(c, a * 3)),
        "graph_result_same": bool(cupy.array_equal(cb, before)),
    }


def supply_held() -> int:
    """Host bytes the process's host page supply holds (free and in use)."""
    import rrmm

    f = rrmm.host_pages.figures()
    return int(f["free_bytes"] + f["leased_bytes"])


def vm_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def page_rates(gib: int = 8) -> dict[str, float]:
    """The host's page-making rates, GB/s: plain pages made at first touch (an anonymous map
    written once) and page-locked pages (``cudaHostAlloc`` of the same size, which makes and
    pins them): what a first sleep with nothing made ahead is bounded by."""
    import mmap

    import cupy

    n = gib * GIB
    t = time.perf_counter()
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block = b"\1" * (64 << 20)
    for off in range(0, n, len(block)):
        m[off:off + len(block)] = block
    touch = n / (time.perf_counter() - t) / 1e9
    m.close()
    t = time.perf_counter()
    pinned = cupy.cuda.alloc_pinned_memory(n)
    pin = n / (time.perf_counter() - t) / 1e9
    del pinned
    return {"first_touch_gbps": touch, "pinned_alloc_gbps": pin, "gib": gib}


def part_d(args: argparse.Namespace) -> dict[str, Any]:
    import rrmm

    link = link_gbps()
    log("link", link)
    if args.keep_ready:
        # The pages kept ready while the pool grows (reinitialize(keep_sleep_ready=True)).
        rrmm.reinitialize(pool_allocator="expandable", keep_sleep_ready=True)
        mr: Any = rrmm.mr.get_current_device_resource()
    else:
        mr = expandable_pool()
    arrays = fill(args.gib)
    ptrs = [a.data.ptr for a in arrays]
    t = time.perf_counter()
    if args.no_prepare:
        asked = 0  # nothing made ahead: the first sleep makes its pages while it copies
    elif args.keep_ready:
        rrmm.host_pages.wait()  # what is still being made once the arrays are written
        asked = rrmm.host_pages.figures()["free_bytes"]
    else:
        asked = mr.prepare_sleep(wait=True)
    prepare_s = time.perf_counter() - t
    log("prepared", asked, "bytes in", prepare_s, "s;", rrmm.host_pages.figures())
    sleeps = []
    other_row: dict[str, Any] | None = None
    timed = args.sleeps + (1 if args.other_check == "extra" else 0)
    for i in range(timed):
        free_awake = device_free()
        t = time.perf_counter()
        did = mr.offload()
        offload_s = time.perf_counter() - t
        free_asleep = device_free()
        checked_here = other_row is None and (args.other_check == "first" or i == timed - 1)
        if checked_here:
            take = int((free_asleep - free_awake) * 0.9)
            other = subprocess.run([sys.executable, "-c", CHILD, str(take)], capture_output=True,
                                   text=True, timeout=300, check=False)
            other_row = (json.loads(other.stdout) if other.returncode == 0
                         else {"error": other.stderr[-500:]})
        t = time.perf_counter()
        mr.restore()
        restore_s = time.perf_counter() - t
        steps = mr.last_sleep()
        copied = did["copied_bytes"]
        row = {
            "sleep": i + 1,
            "after_other_process": checked_here,
            "copied_bytes": copied,
            "freed_on_device_bytes": free_asleep - free_awake,
            "offload_s": offload_s,
            "restore_s": restore_s,
            "offload_gbps": copied / offload_s / 1e9,
            "restore_gbps": copied / restore_s / 1e9,
            "offload_vs_link": copied / offload_s / 1e9 / link["d2h_gbps"],
            "restore_vs_link": copied / restore_s / 1e9 / link["h2d_gbps"],
            "host_reused": steps["host_reused"] if steps else None,
            "steps": steps,
            "supply_held_bytes": supply_held(),
            "data_and_addresses_ok": check(arrays, ptrs),
        }
        log(row)
        sleeps.append(row)
    rates = page_rates() if args.no_prepare else None
    log("host page-making rates", rates)
    return {"part": "d", "gib": args.gib, "keep_ready": args.keep_ready,
            "no_prepare": args.no_prepare, "host_page_rates": rates,
            "other_check": args.other_check, "link": link,
            "prepare_sleep_s": prepare_s,
            "prepared_bytes": asked, "other_process_after_first_offload": other_row,
            "sleeps": sleeps, "host_pages": rrmm.host_pages.figures()}


def part_e(args: argparse.Namespace) -> dict[str, Any]:
    import cupy

    mr = expandable_pool()
    arrays = fill(args.gib)
    ptrs = [a.data.ptr for a in arrays]
    sums = [int(a.sum(dtype=cupy.uint64)) for a in arrays]
    src, out = arrays[0], cupy.empty_like(arrays[0])
    stream = cupy.cuda.Stream(non_blocking=True)
    graph = captured_graph(src, out, stream, times=3, plus=7)
    graph.launch(stream)
    stream.synchronize()
    graph_sum = int(out.sum(dtype=cupy.uint64))
    mr.prepare_sleep(wait=True)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i in range(args.cycles):
        if time.perf_counter() - started > args.budget_s:
            break
        free_awake = device_free()
        t = time.perf_counter()
        mr.offload()
        offload_s = time.perf_counter() - t
        free_asleep = device_free()
        held = supply_held()
        t = time.perf_counter()
        mr.restore()
        restore_s = time.perf_counter() - t
        out.fill(0)
        graph.launch(stream)
        stream.synchronize()
        ok = ([a.data.ptr for a in arrays] == ptrs
              and [int(a.sum(dtype=cupy.uint64)) for a in arrays] == sums
              and int(out.sum(dtype=cupy.uint64)) == graph_sum)
        report = mr.last_sleep() or {}
        rows.append({"cycle": i + 1, "offload_s": offload_s, "restore_s": restore_s,
                     "freed_on_device_bytes": free_asleep - free_awake,
                     "supply_held_bytes": held, "vm_rss_bytes": vm_rss(), "ok": ok,
                     "host_reused": report.get("host_reused")})
        if not ok:
            break
    def spread(key: str) -> list[float]:
        vals = sorted(float(r[key] or 0) for r in rows)
        return [vals[0], vals[len(vals) // 2], vals[-1]] if vals else []
    return {
        "part": "e", "gib": args.gib, "cycles_run": len(rows),
        "all_ok": all(r["ok"] for r in rows),
        "all_host_reused_after_prepare": all(r["host_reused"] for r in rows),
        "offload_s_min_med_max": spread("offload_s"),
        "restore_s_min_med_max": spread("restore_s"),
        "freed_on_device_min_med_max": spread("freed_on_device_bytes"),
        "supply_held_min_med_max": spread("supply_held_bytes"),
        "vm_rss_min_med_max": spread("vm_rss_bytes"),
        "cycles": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices="abcde", required=True)
    p.add_argument("--sleeps", type=int, default=3, help="sleeps after the first (d)")
    p.add_argument("--keep-ready", action="store_true",
                   help="d: reinitialize(keep_sleep_ready=True) instead of prepare_sleep()")
    p.add_argument("--no-prepare", action="store_true",
                   help="d: nothing made ahead (no prepare_sleep, no keep_sleep_ready): the "
                        "first sleep makes its host pages while it copies; the host's "
                        "page-making rates measured after the sleeps")
    p.add_argument("--other-check", choices=["extra", "first"], default="extra",
                   help="d: the second process's allocation in one more sleep after the timed "
                        "ones (extra) or after the first (first)")
    p.add_argument("--cycles", type=int, default=1000, help="sleep cycles of the soak (e)")
    p.add_argument("--budget-s", type=float, default=240.0, help="the soak's time limit (e)")
    p.add_argument("--gib", type=int, default=40, help="GiB of CuPy arrays (parts a, b)")
    p.add_argument("--other-gib", type=int, default=30, help="GiB the second process takes (b)")
    p.add_argument("--elements", type=int, default=1 << 28, help="float32 elements per tensor (c)")
    args = p.parse_args()
    row = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e}[args.part](args)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
