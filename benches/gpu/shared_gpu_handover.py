"""Hand-over between two processes on one GPU through rrmm's ledger (issue 38's latencies).

Two cases, each with a holder process H and an asker A (both ``rrmm.reinitialize(
pool_allocator="expandable", share_gpu=...)`` with CuPy on rrmm's hook):

- cached: H allocates ``--cached-gib`` of CuPy arrays and frees them (its expandable pool keeps
  the pages mapped: cached); A then allocates what the device has free plus that much. Timed: A's
  allocation (the ask, H's trim, A's mapping), and the ask's own latency from the ledger.
- live: H keeps ``--live-gib`` of data (a checksum taken), declares itself idle; A allocates
  what is free plus that much. H's pool sleeps (its data to pinned host memory); A's allocation
  is timed (GB/s of the bytes moved); then A frees, H declares busy, wakes, and checks its
  checksum.

Prints one JSON line per case and a summary. Runs each case in fresh processes; every child has
a timeout and is ended by its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

GIB = 1 << 30


def holder(case: str, gib: float, ledger: str, ready: str, go: str) -> None:
    import cupy as cp
    import rrmm
    from rrmm.allocators.cupy import rmm_cupy_allocator

    os.environ["RRMM_LEDGER_DIR"] = ledger
    rrmm.reinitialize(pool_allocator="expandable", share_gpu={"name": "holder", "soft_share": "1%"})
    cp.cuda.set_allocator(rmm_cupy_allocator)
    n = int(gib * GIB) // 4
    # Filled in place: no temporary, so the pool holds exactly `gib` (live, or cached once
    # freed).
    data = cp.empty(n, dtype=cp.float32)
    data.fill(7.0)
    data[::4096] = cp.arange(data[::4096].size, dtype=cp.float32)
    checksum = float(data.sum())
    if case == "cached":
        del data
        cp.cuda.runtime.deviceSynchronize()
    else:
        # The host pages of a sleep made ahead of need (the documented setup of a process that
        # may be put to sleep), then idle.
        rrmm.mr.get_current_device_resource().prepare_sleep(wait=True)
        rrmm.shared_gpu.declare_idle()
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    result: dict[str, Any] = {"history": rrmm.shared_gpu.history()}
    if case == "live":
        t = time.perf_counter()
        woken = rrmm.shared_gpu.declare_busy()
        result["wake_s"] = time.perf_counter() - t
        result["woken"] = woken
        result["checksum_ok"] = float(data.sum()) == checksum
    print(json.dumps(result), flush=True)


def asker(gib: float, ledger: str) -> None:
    import cupy as cp
    import rrmm
    from rrmm.allocators.cupy import rmm_cupy_allocator

    os.environ["RRMM_LEDGER_DIR"] = ledger
    rrmm.reinitialize(pool_allocator="expandable", share_gpu={"name": "asker"})
    cp.cuda.set_allocator(rmm_cupy_allocator)
    warm = cp.ones(1 << 20, dtype=cp.float32)
    float(warm.sum())
    del warm
    free, _total = cp.cuda.runtime.memGetInfo()
    want = free - (1 << 30) + int(gib * GIB)
    t = time.perf_counter()
    error = ""
    try:
        big = cp.empty(want // 4, dtype=cp.float32)
        big.fill(1)
        cp.cuda.runtime.deviceSynchronize()
        del big
    except Exception as e:  # noqa: BLE001 (reported)
        error = f"{type(e).__name__}: {e}"[:300]
    seconds = time.perf_counter() - t
    print(json.dumps({"want": want, "seconds": seconds, "error": error,
                      "history": rrmm.shared_gpu.history()}), flush=True)


def run_case(case: str, gib: float, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = os.path.join(tmp, "ledger")
        os.mkdir(ledger, 0o700)
        ready, go = os.path.join(tmp, "ready"), os.path.join(tmp, "go")
        h = subprocess.Popen([sys.executable, __file__, "--role", "holder", "--case", case,
                              "--gib", str(gib), "--ledger", ledger, "--ready", ready, "--go", go],
                             stdout=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + timeout
            while not os.path.exists(ready):
                if time.monotonic() > deadline or h.poll() is not None:
                    raise RuntimeError("the holder did not get ready")
                time.sleep(0.05)
            a = subprocess.run([sys.executable, __file__, "--role", "asker", "--gib", str(gib),
                                "--ledger", ledger], capture_output=True, text=True,
                               timeout=timeout, check=False)
            open(go, "w").close()
            out_h, _ = h.communicate(timeout=timeout)
        finally:
            if h.poll() is None:
                h.kill()
                h.wait()
        asked: dict[str, Any] = json.loads(a.stdout.strip().splitlines()[-1]) if a.stdout.strip() else {
            "error": a.stderr[-500:]}
        held: dict[str, Any] = json.loads(out_h.strip().splitlines()[-1]) if out_h.strip() else {}
    asks = [e for e in asked.get("history", []) if e["kind"] == "asked"]
    gave = [e for e in held.get("history", []) if e["kind"] in ("gave", "slept")]
    moved = sum(e["given"] for e in gave)
    return {
        "case": case,
        "gib": gib,
        "allocation_s": asked.get("seconds"),
        "error": asked.get("error", ""),
        "ask_s": [round(e["seconds"], 4) for e in asks],
        "given_gib": round(moved / GIB, 2),
        "holder_s": [round(e["seconds"], 4) for e in gave],
        # The last event's own bytes over its own time (a sleep's after a trim's).
        "gb_per_s": round(gave[-1]["given"] / 1e9 / gave[-1]["seconds"], 1)
        if gave and gave[-1]["seconds"] else None,
        "wake_s": held.get("wake_s"),
        "checksum_ok": held.get("checksum_ok"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["holder", "asker"])
    p.add_argument("--case", choices=["cached", "live"], default="cached")
    p.add_argument("--gib", type=float, default=10.0)
    p.add_argument("--ledger")
    p.add_argument("--ready")
    p.add_argument("--go")
    p.add_argument("--cached-gib", type=float, default=10.0)
    p.add_argument("--live-gib", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    if args.role == "holder":
        holder(args.case, args.gib, args.ledger, args.ready, args.go)
        return
    if args.role == "asker":
        asker(args.gib, args.ledger)
        return
    for case, gib in (("cached", args.cached_gib), ("live", args.live_gib)):
        r = run_case(case, gib, args.timeout)
        print(json.dumps(r), flush=True)
        print(f"handover {case} {gib} GiB: allocation {r['allocation_s']}, ask {r['ask_s']}, "
              f"given {r['given_gib']} GiB, holder {r['holder_s']} ({r['gb_per_s']} GB/s), "
              f"wake {r['wake_s']}, checksum {r['checksum_ok']}, error {r['error'] or '-'}",
              flush=True)


if __name__ == "__main__":
    main()
