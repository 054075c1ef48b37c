"""W3: W1's traces driven through DeviceBuffer objects from Python, rrmm vs RMM, interleaved."""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from w2 import libraries, make_each, median_each, write_results

HERE = Path(__file__).resolve().parent


def load(path: str):
    ops = []
    with open(path) as f:
        for line in f:
            a, slot, size = line.split()
            ops.append((a == "a", int(slot), int(size)))
    return ops


def replay(mod, mr, ops):
    DeviceBuffer = mod.DeviceBuffer
    slots: list = [None] * (max(s for _, s, _ in ops) + 1)
    gc.disable()
    t0 = time.perf_counter_ns()
    for alloc, slot, size in ops:
        if alloc:
            slots[slot] = DeviceBuffer(size=size, mr=mr)
        else:
            slots[slot] = None
    t1 = time.perf_counter_ns()
    gc.enable()
    slots.clear()
    return (t1 - t0) / len(ops)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="w3.json")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--traces", default="/tmp/random_10k_1mib.txt,/tmp/transformer_training.txt")
    ap.add_argument("--resources", default="pool,binning,cuda_async,arena")
    args = ap.parse_args()
    mods = libraries()
    results = []
    for trace in args.traces.split(","):
        ops = load(trace)
        for res in args.resources.split(","):
            mrs = make_each(mods, res)
            timed = median_each(mrs, args.reps, lambda k, mr, ops=ops: replay(mods[k], mr, ops))
            name = Path(trace).stem
            for k, med in timed.items():
                results.append({"impl": k, "trace": name, "resource": res, "ns_per_event": med})
                print(f"W3 {k:5s} {name:22s} {res:10s} {med:8.0f} ns/event")
            mrs.clear()
            gc.collect()
    write_results(args.out, results)


if __name__ == "__main__":
    main()
