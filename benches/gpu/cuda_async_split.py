"""Where a cuda_async round trip goes from Python, rrmm beside RMM in one process (issue 21's W2
row): DeviceBuffer(size=1 MiB) allocate-and-drop, the resource's own allocate/deallocate, and the
same DeviceBuffer loop on a fresh thread that has no CUDA context yet (the case the context
guard used to pay two cuCtxSetCurrent per call for). Alternating repetitions, medians; JSON lines
to --out. With `perf` on the machine, --perf FILE also records the rrmm DeviceBuffer loop.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

SIZE = 1 << 20


def per_call(fn: Callable[[int], None], n: int) -> float:
    fn(min(n, 500))  # warm-up
    gc.disable()
    t0 = time.perf_counter_ns()
    fn(n)
    t1 = time.perf_counter_ns()
    gc.enable()
    return (t1 - t0) / n


def buffers(mod: Any) -> Callable[[int], None]:
    DeviceBuffer = mod.DeviceBuffer

    def run(n: int) -> None:
        for _ in range(n):
            DeviceBuffer(size=SIZE)

    return run


def resource_calls(mr: Any) -> Callable[[int], None]:
    allocate, deallocate = mr.allocate, mr.deallocate

    def run(n: int) -> None:
        for _ in range(n):
            deallocate(allocate(SIZE), SIZE)

    return run


def on_fresh_thread(fn: Callable[[int], None]) -> Callable[[int], None]:
    def run(n: int) -> None:
        t = threading.Thread(target=fn, args=(n,))
        t.start()
        t.join()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="cuda_async_split.jsonl")
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    import rmm
    import rrmm

    mods = {"rrmm": rrmm, "rmm": rmm}
    mrs = {k: m.mr.CudaAsyncMemoryResource() for k, m in mods.items()}
    for k, m in mods.items():
        m.mr.set_current_device_resource(mrs[k])
    variants: dict[str, Callable[[int], None]] = {}
    for k, m in mods.items():
        variants[f"{k} DeviceBuffer"] = buffers(m)
        variants[f"{k} mr.allocate+deallocate"] = resource_calls(mrs[k])
        variants[f"{k} DeviceBuffer, fresh thread"] = on_fresh_thread(buffers(m))
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.reps):
        for name, fn in variants.items():
            times[name].append(per_call(fn, args.n))
    with open(args.out, "w") as out:
        print(f"cuda_async 1 MiB round trip from Python, ns (median of {args.reps}, n={args.n})")
        for name, ts in times.items():
            med = statistics.median(ts)
            row = {"variant": name, "ns": med, "min": min(ts), "max": max(ts)}
            out.write(json.dumps(row) + "\n")
            print(f"  {name:36s} {med:8.0f}  ({min(ts):.0f}-{max(ts):.0f})")


if __name__ == "__main__":
    main()
