"""W2 on a CPU: the Python DeviceBuffer round trip (allocate, then drop) of benches/gpu/w2.py on
the pool over simulated memory and on the expandable pool over simulated virtual memory,
interleaved.

    python benches/python/w2_simulated.py [--iters N] [--reps R]

Prints ns per round trip for each size (median of R repetitions of N round trips each) and the
expandable/pool ratio. Neither resource releases the GIL on these calls, as neither does the
pool over a device nor the expandable pool without a release threshold on a GPU.
"""

import argparse
import statistics
import sys
from pathlib import Path

import rrmm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from w2 import POOL, SIZES, time_round_trips

CAPACITY = 64 << 30


def make(name):
    mr = rrmm.mr
    if name == "pool":
        return mr.PoolMemoryResource(mr.SimulatedMemoryResource(CAPACITY), initial_pool_size=POOL)
    return mr.ExpandableMemoryResource(initial_pool_size=POOL, simulated_capacity=CAPACITY)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    resources = {name: make(name) for name in ("pool", "expandable")}
    for label, size in SIZES.items():
        times = {name: [] for name in resources}
        for _ in range(args.reps):
            for name, mr in resources.items():
                times[name].append(time_round_trips(rrmm, mr, size, args.iters))
        pool, expandable = (statistics.median(times[n]) for n in ("pool", "expandable"))
        print(
            f"W2 {label:6s} pool {pool:6.0f} ns  expandable {expandable:6.0f} ns  "
            f"ratio {expandable / pool:.2f}"
        )


if __name__ == "__main__":
    main()
