"""W2: Python DeviceBuffer round trip (allocate then drop), rrmm vs RMM, same process, interleaved.

Prints a table of ns per round trip and writes JSON. Run on a GPU machine with both packages
importable (scripts/gpu_run.sh installs them).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

SIZES = {"1KiB": 1 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}
POOL = 8 << 30


def make(mod, name):
    mr = mod.mr
    if name == "cuda":
        return mr.CudaMemoryResource()
    if name == "managed":
        return mr.ManagedMemoryResource()
    if name == "cuda_async":
        return mr.CudaAsyncMemoryResource()
    if name == "pool":
        return mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=POOL)
    if name == "binning":
        pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=POOL)
        return mr.BinningMemoryResource(pool, 18, 22)
    if name == "expandable":
        return mr.ExpandableMemoryResource(initial_pool_size=POOL)
    if name == "arena":
        return mr.ArenaMemoryResource(mr.CudaMemoryResource(), arena_size=POOL)
    raise ValueError(name)


def libraries() -> dict[str, Any]:
    """The libraries compared: rrmm, and RMM where it imports."""
    import rrmm

    mods: dict[str, Any] = {"rrmm": rrmm}
    try:
        import rmm

        mods["rmm"] = rmm
    except ImportError as e:  # pragma: no cover - reference absent
        print("RMM not importable:", e)
    return mods


def make_each(mods: dict[str, Any], name: str) -> dict[str, Any]:
    """Resource `name` of each library in `mods` that can make it (the others are printed)."""
    mrs = {}
    for k, mod in mods.items():
        try:
            mrs[k] = make(mod, name)
        except (AttributeError, RuntimeError, MemoryError, ValueError) as e:  # missing in one library
            print(f"{k} {name}: {type(e).__name__}: {e}")
    return mrs


def median_each(
    mrs: dict[str, Any], reps: int, measure: Callable[[str, Any], float]
) -> dict[str, float]:
    """The median of `reps` rounds of `measure(library, resource)` for each resource in `mrs`,
    the libraries interleaved in every round."""
    times: dict[str, list[float]] = {k: [] for k in mrs}
    for _ in range(reps):
        for k, mr in mrs.items():
            times[k].append(measure(k, mr))
    return {k: statistics.median(ts) for k, ts in times.items() if ts}


def write_results(path: str, results: list[dict[str, Any]]) -> None:
    """Writes the rows to `path` as JSON."""
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def time_round_trips(mod, mr, size, n):
    DeviceBuffer = mod.DeviceBuffer
    mod.mr.set_current_device_resource(mr)
    for _ in range(min(n, 200)):  # warm-up
        DeviceBuffer(size=size)
    gc.disable()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        DeviceBuffer(size=size)
    t1 = time.perf_counter_ns()
    gc.enable()
    return (t1 - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="w2.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--resources", default="cuda,managed,cuda_async,pool,expandable,binning,arena")
    args = ap.parse_args()
    mods = libraries()
    results = []
    for res in args.resources.split(","):
        for label, size in SIZES.items():
            n = {"cuda": 2000, "managed": 2000}.get(res, 20000)
            if size >= 64 << 20 and res in ("cuda", "managed"):
                n = 300
            mrs = make_each(mods, res)
            timed = median_each(
                mrs, args.reps, lambda k, mr, size=size, n=n: time_round_trips(mods[k], mr, size, n)
            )
            for k, med in timed.items():
                results.append({"impl": k, "resource": res, "size": label, "ns": med})
                print(f"W2 {k:5s} {res:10s} {label:6s} {med:10.0f} ns")
            for k, mod in mods.items():
                mod.mr.set_current_device_resource(mod.mr.CudaMemoryResource())
            mrs.clear()
            gc.collect()
    write_results(args.out, results)


if __name__ == "__main__":
    main()
