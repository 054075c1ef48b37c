"""What rrmm.record_memory_history costs: W4 (``cupy.empty(1 MiB)``) and W5
(``torch.empty(1 MiB)``) through rrmm's hooks over a pool, with the history off, on without
stacks, and on with Python stacks; each framework in its own process. Also writes a CuPy
workload's snapshot with its history (``--snapshot OUT.pickle``) and checks that PyTorch's
``torch.cuda._memory_viz`` reads it (``trace_plot``, ``segment_plot``).

    python3 benches/gpu/history_cost.py [--snapshot cupy_history.pickle]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import time
from typing import Any

MIB = 1 << 20
ROUNDS = 20001


def per_call_ns(fn: Any, n: int = ROUNDS) -> float:
    for _ in range(1000):
        fn()
    samples = []
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(n // 7):
            fn()
        samples.append((time.perf_counter_ns() - t0) / (n // 7))
    return statistics.median(samples)


def modes(fn: Any) -> dict[str, float]:
    import rrmm

    out = {}
    for name, enabled, stacks in (("off", None, None), ("on_no_stacks", "all", None),
                                  ("on_python_stacks", "all", "python")):
        rrmm.record_memory_history(enabled, max_entries=100_000, stacks=stacks)
        out[name] = per_call_ns(fn)
    rrmm.record_memory_history(None)
    return out


def run_cupy(snapshot: str | None) -> dict[str, Any]:
    import cupy
    import rrmm
    from rrmm.allocators.cupy import rmm_cupy_allocator

    rrmm.reinitialize(pool_allocator=True, initial_pool_size="1GiB")
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    out: dict[str, Any] = {"w4_cupy_empty_1MiB_ns": modes(
        lambda: cupy.empty(MIB, dtype=cupy.uint8))}
    if snapshot:
        rrmm.record_memory_history("all")
        keep = []
        for step in range(60):  # a small pipeline: growing batches, temporaries, a cache
            x = cupy.random.random((step % 9 + 1) * 32768, dtype=cupy.float32)
            y = cupy.sort(x) * 2
            keep.append(y[: (step % 5 + 1) * 1000].copy())
            if len(keep) > 12:
                keep.pop(0)
        cupy.cuda.Device().synchronize()
        snap = rrmm.memory_snapshot()
        rrmm.record_memory_history(None)
        with open(snapshot, "wb") as f:
            pickle.dump(snap, f)
        out["snapshot_entries"] = len(snap["device_traces"][0])
        try:
            from torch.cuda import _memory_viz

            html = _memory_viz.trace_plot(snap)
            seg = _memory_viz.segment_plot(snap)
            out["memory_viz"] = f"trace_plot {len(html)} chars, segment_plot {len(seg)} chars"
        except Exception as e:  # noqa: BLE001 (reported in the output, not hidden)
            out["memory_viz"] = f"failed: {type(e).__name__}: {e}"
    return out


def run_torch() -> dict[str, Any]:
    import rrmm
    import torch
    from rrmm.allocators.torch import rmm_torch_allocator

    rrmm.reinitialize(pool_allocator=True, initial_pool_size="1GiB")
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    return {"w5_torch_empty_1MiB_ns": modes(
        lambda: torch.empty(MIB, dtype=torch.uint8, device="cuda"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--snapshot", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one == "cupy":
        print(json.dumps(run_cupy(args.snapshot)))
        return
    if args.one == "torch":
        print(json.dumps(run_torch()))
        return
    print("history cost, ns per call (median of 7 batches), rrmm hooks over a pool")
    for one in ("cupy", "torch"):
        cmd = [sys.executable, __file__, "--one", one]
        if args.snapshot and one == "cupy":
            cmd += ["--snapshot", args.snapshot]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            print(f"{one}: failed: {proc.stderr[-800:]}")
            continue
        for key, value in json.loads(lines[-1]).items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
