"""CI guard of the Python `DeviceBuffer(size=1 MiB)` round trip (allocate, then drop) over a pool.

    python benches/python/roundtrip_guard.py            # check against the committed baseline
    python benches/python/roundtrip_guard.py --update   # measure and write the baseline

The round trip is timed on memory that needs no GPU, as a ratio to a plain Python loop of
comparable work (constructing and dropping a small Python object with one keyword argument), so
the figure measures rrmm's own path rather than the machine, and holds on a noisy 2-core CI box:

- short bursts, the baseline burst and the round-trip burst alternating, the ratio taken per
  pair (both see the same load), and the median over many pairs;
- two setups: a pool over simulated memory (pure bookkeeping), and a pool over host memory from
  the system allocator, whose source blocks as CUDA memory does, so the resource's GIL decision
  and everything else that differs for real memory is on the timed path as it is on a GPU;
- a setup whose ratio rose by `--factor` (1.3x) or more over the baseline is measured again in a
  fresh process, and the run fails (exit 1) only when the second measurement rises as much.

Issue 28: the round trip over a pool on the H100 went from 278-281 ns at 745cda1 to 456-470 ns
(the pool's calls released and retook the GIL). On a CPU that same change costs ~800 instructions
(~70 ns), a ~1.3x step of `pool(system)` here, right at the limit; the decision itself is checked
exactly by tests/python/test_gil_decision.py, and this guard catches the steps of any cause.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIZE = 1 << 20
BASELINE = Path(__file__).with_name("roundtrip_guard.json")
SETUPS = ("pool(simulated)", "pool(system)")


class _Plain:
    """The baseline's object: one slot set from one keyword argument."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


def _baseline_burst(n: int) -> float:
    plain = _Plain
    t0 = time.perf_counter_ns()
    for _ in range(n):
        plain(size=SIZE)
    return (time.perf_counter_ns() - t0) / n


def _round_trip_burst(n: int) -> float:
    import rrmm

    device_buffer = rrmm.DeviceBuffer
    t0 = time.perf_counter_ns()
    for _ in range(n):
        device_buffer(size=SIZE)
    return (time.perf_counter_ns() - t0) / n


def _make(name: str) -> Any:
    import rrmm

    mr = rrmm.mr
    if name == "pool(simulated)":
        source = mr.SimulatedMemoryResource(64 << 30)
    elif name == "pool(system)":
        source = mr.SystemMemoryResource()
    else:
        raise ValueError(name)
    return mr.PoolMemoryResource(source, initial_pool_size=64 << 20)


def measure(name: str, bursts: int, n: int) -> dict[str, float]:
    """Times `name` in this process: the median ratio over `bursts` alternating pairs of bursts
    of `n` round trips and `n` baseline constructions, and the median ns of each."""
    import rrmm

    rrmm.mr.set_current_device_resource(_make(name))
    _round_trip_burst(n)  # warm-up: the pool's block, the stream's list, caches
    _baseline_burst(n)
    ratios, trips, bases = [], [], []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(bursts):
            b = _baseline_burst(n)
            t = _round_trip_burst(n)
            ratios.append(t / b)
            trips.append(t)
            bases.append(b)
    finally:
        if enabled:
            gc.enable()
    return {
        "ratio": statistics.median(ratios),
        "round_trip_ns": statistics.median(trips),
        "baseline_ns": statistics.median(bases),
    }


def measure_fresh(name: str, bursts: int, n: int) -> dict[str, float]:
    """`measure` in a fresh interpreter (nothing left over from earlier setups)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--bursts", str(bursts), "--n", str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--update", action="store_true", help="write the baseline file")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--factor", type=float, default=1.3, help="failing rise of the ratio")
    ap.add_argument("--bursts", type=int, default=300)
    ap.add_argument("--n", type=int, default=1000, help="round trips per burst")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.bursts, args.n)))
        return 0
    results = {name: measure_fresh(name, args.bursts, args.n) for name in SETUPS}
    if args.update:
        record = {
            "what": "DeviceBuffer(size=1 MiB) round trip / plain Python loop, median of "
            "alternating bursts (benches/python/roundtrip_guard.py)",
            "python": platform.python_version(),
            "machine": platform.machine(),
            "ratios": {k: round(v["ratio"], 3) for k, v in results.items()},
            "ns": {k: round(v["round_trip_ns"]) for k, v in results.items()},
            "baseline_ns": {k: round(v["baseline_ns"]) for k, v in results.items()},
        }
        args.baseline.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.baseline}: {record['ratios']}")
        return 0
    committed = json.loads(args.baseline.read_text())["ratios"]
    failed = []
    for name, res in results.items():
        ratio, base = res["ratio"], committed[name]
        verdict = "ok"
        if ratio >= args.factor * base:
            again = measure_fresh(name, args.bursts, args.n)
            verdict = f"rose {ratio / base:.2f}x; measured again: {again['ratio']:.2f}"
            if again["ratio"] >= args.factor * base:
                failed.append(name)
                verdict += f" -> FAIL (limit {args.factor}x)"
            else:
                verdict += " -> ok (noise)"
        print(
            f"round trip {name:16s} {res['round_trip_ns']:6.0f} ns, plain loop "
            f"{res['baseline_ns']:5.0f} ns: ratio {ratio:.2f} (baseline {base:.2f}) {verdict}"
        )
    if failed:
        print(
            f"FAIL: the DeviceBuffer round trip over {', '.join(failed)} is {args.factor}x or more "
            f"slower relative to plain Python than the committed baseline ({args.baseline.name}); "
            "if the step is intended, run with --update and commit the new baseline."
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
