"""Beyond VRAM with promotion (issue 37, W11 and its reuse-after-room variant): CuPy arrays of
2 GiB totalling F x the device, each written once, summed once (streaming) and twice more
(reuse), as W11 does; then the first arrays are freed until what stays live is at most 70% of
the device (the arrays written last, which lie beyond the device), and those are summed three
times (hot reuse). One fresh process per (setup, F).

Setups:
- ``spill``: ``ExpandableMemoryResource(spill_to_host=...)``, its host pages made ahead
  (``prepare_spill``, timed apart, on 16 threads), and ``promote()`` after the frees (timed
  with the hot reuse);
- ``spill_no_promote``: the same, no promotion (the data is read in place over the link);
- ``spill_demand``: spill pages made when the device runs out (no ``prepare_spill``);
- ``tier``: the device pool then a pinned host pool over the host page supply, made ahead
  (``docs/which_setup.md``'s host tier);
- ``rrmm_managed_pool`` and ``rmm_managed_pool``: ``reinitialize(managed_memory=True,
  pool_allocator=True)`` of each library.

Floors (``scale.floor_s``: the bytes beyond the device over the link measured in the same run,
the rest at device bandwidth); the hot reuse's floor is its spilled bytes over the link once
plus three reads at device bandwidth.

    python3 spill_promote.py --all [--fs 1.15,1.5,2.0] [--setups spill,tier,...] [--out F]
    python3 spill_promote.py --run spill --f 1.5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GIB = 1 << 30
ARRAY = 2 * GIB
SETUPS = "spill,spill_no_promote,tier,rrmm_managed_pool,rmm_managed_pool,spill_demand"


def setup(name: str, f: float, total: int) -> dict[str, Any]:
    """Installs setup `name` for F = `f`; what it did and how long its pages took."""
    import cupy

    out: dict[str, Any] = {}
    beyond = int(max(0.05, f - 0.85) * total) // ARRAY * ARRAY + 2 * ARRAY
    if name.startswith("spill"):
        import rrmm
        from rrmm import mr
        from rrmm.allocators.cupy import rmm_cupy_allocator

        pool = mr.ExpandableMemoryResource(spill_to_host=beyond + 4 * GIB)
        if name != "spill_demand":
            t0 = time.perf_counter()
            made = pool.prepare_spill(beyond, threads=16)
            out["prepare_s"] = time.perf_counter() - t0
            out["prepare_GBps"] = made / out["prepare_s"] / 1e9
        mr.set_current_device_resource(pool)
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        out["pool"] = pool
        out["lib"] = rrmm
    elif name.startswith("any_size") or name == "rrmm_pool":
        # Issue 48's one setup, a single word and no size; ``any_size_frees`` also moves
        # spilled data back at frees (auto_promote="frees"), ``any_size_at_rest`` declares a
        # safe point (``rrmm.at_rest()``) before the hot reuse. ``rrmm_pool``: the device pool.
        import rrmm
        from rrmm.allocators.cupy import rmm_cupy_allocator

        t0 = time.perf_counter()
        if name.startswith("any_size_p"):
            # The same pool with pages of N MiB (fewer driver calls per byte mapped).
            resource = rrmm.mr.ExpandableMemoryResource(
                spill_to_host=True, page_size=int(name.rsplit("_p", 1)[1]) << 20)
            rrmm.mr.set_current_device_resource(resource)
        else:
            rrmm.reinitialize(pool_allocator="any_size" if name != "rrmm_pool" else True)
            resource = rrmm.mr.get_current_device_resource()
        if name == "any_size_frees":
            resource.auto_promote = "frees"
        out["setup_s"] = time.perf_counter() - t0
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        if name != "rrmm_pool":
            out["pool"] = resource
    elif name == "tier":
        import rrmm
        from rrmm import mr
        from rrmm.allocators.cupy import rmm_cupy_allocator

        t0 = time.perf_counter()
        device = mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=0)
        host = mr.PoolMemoryResource(mr.PinnedHostMemoryResource(), initial_pool_size=beyond)
        out["prepare_s"] = time.perf_counter() - t0
        mr.set_current_device_resource(mr.TieredMemoryResource(device, [host], names=["host"]))
        cupy.cuda.set_allocator(rmm_cupy_allocator)
    else:
        lib_name = name.split("_", 1)[0]
        import importlib

        lib = importlib.import_module(lib_name)
        importlib.import_module(f"{lib_name}.mr")
        lib.reinitialize(managed_memory=True, pool_allocator=True)
        hook = importlib.import_module(f"{lib_name}.allocators.cupy")
        cupy.cuda.set_allocator(hook.rmm_cupy_allocator)
    return out


def sums(arrays: list[Any], times: int) -> tuple[list[float], float]:
    import scale

    out = []
    total = 0.0
    for _ in range(times):
        scale.sync()
        t0 = time.perf_counter()
        total = 0.0
        for a in arrays:
            total += float(a.sum())
        out.append(time.perf_counter() - t0)
    return out, total


def run_case(name: str, f: float) -> dict[str, Any]:
    import cupy
    import scale

    total = cupy.cuda.Device().mem_info[1]
    scale.warm_up()
    cupy.get_default_memory_pool().free_all_blocks()
    got = setup(name, f, total)
    pool = got.pop("pool", None)
    got.pop("lib", None)
    n = max(1, round(f * total / ARRAY))
    row: dict[str, Any] = {"setup": name, "f": f, "arrays": n, "bytes": n * ARRAY,
                           "device_bytes": total, **got}
    arrays = []
    # W11_SPLIT=1: the fill's time split into the allocations (with what they queue: a managed
    # pool's prefetches) and the writes, each waited for (the profile of a first touch; the
    # fill then serializes what it overlaps otherwise).
    split = os.environ.get("W11_SPLIT") == "1"
    alloc_s = write_s = 0.0
    scale.sync()
    t0 = time.perf_counter()
    try:
        for i in range(n):
            t1 = time.perf_counter()
            a = cupy.empty(ARRAY // 4, dtype=cupy.float32)
            if split:
                scale.sync()
                t2 = time.perf_counter()
                alloc_s += t2 - t1
            a.fill(float(i % 7 + 1))
            if split:
                scale.sync()
                write_s += time.perf_counter() - t2
            arrays.append(a)
        scale.sync()
    except Exception as e:  # noqa: BLE001 (the refusal is the result)
        row["error"] = f"{type(e).__name__} at array {len(arrays)}: {str(e).splitlines()[0][:200]}"
        return row
    row["fill_s"] = time.perf_counter() - t0
    if split:
        row["alloc_s"], row["write_s"] = alloc_s, write_s
    if pool is not None:
        after_fill = pool.spill_figures()
        row["spilled_after_fill"] = after_fill["spilled"]
        row["made_in_fill"] = after_fill["made"]  # beyond the spill: made ahead for nothing yet
    s, got_sum = sums(arrays, 3)
    expected = sum(float(i % 7 + 1) for i in range(n)) * (ARRAY // 4)
    row["sum_s"] = s
    row["checked"] = abs(got_sum - expected) <= 1e-3 * expected
    row["stream_s"] = row["fill_s"] + s[0]
    row["reuse_s"] = row["fill_s"] + sum(s)
    # Hot reuse: free the first arrays until at most 70% of the device stays live.
    keep = max(1, int(0.7 * total) // ARRAY)
    first = n - keep
    scale.sync()
    t0 = time.perf_counter()  # the frees are timed too (auto_promote="frees" moves data there)
    del arrays[:first]
    row["hot_arrays"] = len(arrays)
    row["hot_bytes"] = len(arrays) * ARRAY
    scale.sync()
    if pool is not None:
        row["spilled_hot"] = pool.spill_figures()["spilled"]
        if name == "any_size_at_rest" or name.startswith("any_size_p"):
            import rrmm

            row["promote"] = rrmm.at_rest()
        if name == "spill":
            row["promote"] = pool.promote()
        if "promote" in row:
            report = row["promote"]
            row["promote_GBps"] = report["promoted"] / max(report["seconds"], 1e-9) / 1e9
            moving = report["seconds"] - report["trim_s"]
            row["promote_move_GBps"] = report["promoted"] / max(moving, 1e-9) / 1e9
    hs, hot_sum = sums(arrays, 3)
    row["hot_s"] = time.perf_counter() - t0
    row["hot_sum_s"] = hs
    hot_expected = sum(float(i % 7 + 1) for i in range(first, n)) * (ARRAY // 4)
    row["hot_checked"] = abs(hot_sum - hot_expected) <= 1e-3 * hot_expected
    if pool is not None:
        row["spill_figures"] = pool.spill_figures()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run")
    ap.add_argument("--f", type=float, default=1.5)
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--fs", default="1.15,1.5,2.0")
    ap.add_argument("--setups", default=SETUPS)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--out", default="spill_promote.jsonl")
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run_case(args.run, args.f)), flush=True)
        return
    import cupy
    import scale

    scale.warm_up()
    bw = scale.bandwidth()
    total = cupy.cuda.Device().mem_info[1]
    avail = scale.host_available()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    head = {"bandwidth_GBps": bw, "device_bytes": total, "host_available": avail}
    print(json.dumps(head), flush=True)
    rows = []
    with open(args.out, "a") as out_file:
        out_file.write(json.dumps(head) + "\n")
        for f in [float(x) for x in args.fs.split(",")]:
            if max(0.0, f - 0.8) * total > 0.85 * avail:
                print(f"F={f}: skipped, the host has {avail / GIB:.0f} GiB", flush=True)
                continue
            for name in args.setups.split(","):
                row = scale.run_child(__file__, ["--run", name, "--f", str(f)],
                                      {"setup": name, "f": f}, args.timeout)
                if "stream_s" in row:
                    row["floor_stream_s"] = scale.floor_s(row, bw, 1)
                    row["floor_reuse_s"] = scale.floor_s(row, bw, 3)
                    beyond_hot = max(0, row["hot_bytes"] - max(0, row["device_bytes"]
                                                               - (row["bytes"] - row["hot_bytes"])))
                    row["floor_hot_s"] = (beyond_hot / (bw["h2d"] * 1e9)
                                          + 3 * row["hot_bytes"] / (bw["device"] * 1e9))
                rows.append(row)
                out_file.write(json.dumps(row) + "\n")
                out_file.flush()
                print(line(row), flush=True)
    print("\nF     setup               prep s   fill s  stream s (x floor)  reuse s (x floor)  "
          "hot s (x floor)  promote GB/s")
    for r in rows:
        print(line(r))


def line(r: dict[str, Any]) -> str:
    if "stream_s" not in r:
        return f"{r['f']:<5} {r['setup']:18} {r.get('error', '?')[:100]}"
    ok = "" if r.get("checked") and r.get("hot_checked") else "  SUM WRONG"
    prep = r.get("prepare_s", r.get("setup_s"))
    split = f"  (alloc {r['alloc_s']:.2f} + write {r['write_s']:.2f})" if "alloc_s" in r else ""
    return (f"{r['f']:<5} {r['setup']:18} {prep if prep is None else round(prep, 2)!s:>6} "
            f"{r['fill_s']:7.2f} {r['stream_s']:8.2f} ({r['stream_s'] / r['floor_stream_s']:4.1f}x)"
            f" {r['reuse_s']:9.2f} ({r['reuse_s'] / r['floor_reuse_s']:4.1f}x)"
            f" {r['hot_s']:8.2f} ({r['hot_s'] / r['floor_hot_s']:4.1f}x)"
            f"  {r.get('promote_GBps', 0):6.1f}{ok}{split}")


if __name__ == "__main__":
    main()
