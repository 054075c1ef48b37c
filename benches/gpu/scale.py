"""Data of every size (issue 28, W11 in benchmarks.md): CuPy arrays whose live total is F x the
device's memory, in 2 GiB arrays, each written once (fill) as it is made, then all read once (the
streaming pass: fill + sum 1) and twice more (the reuse pass: fill + sums 1-3), under each
allocator setup of rrmm and RMM, one fresh process per (library, setup, F).

Each row gets the floor: the bytes beyond the device's memory crossing the link once each way
(the reuse pass: once in, three times out) at the link bandwidth measured in the same run, plus
the rest at the device bandwidth measured there, and its ratio to it. After the passes each
process asks for one more 4 GiB array (the near-full case of issue 28).

    python3 scale.py --all [--fs 0.5,0.9,1.15,1.5,2.0] [--setups rrmm:managed_pool,...]
    python3 scale.py --run rrmm:managed_pool --f 1.5          # one case, one JSON line

A setup is LIB:NAME, NAME a key of w8_w9.SETUPS or ``expr=`` and a resource expression (``mr``
bound to the library's ``mr``); setups are separated by ``;`` when an expression holds commas. F values whose bytes beyond the device exceed
85% of the host's available memory are skipped (the host must hold them), and so are device-only
setups past F = 1 (they cannot hold the data: one case each shows the refusal).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GIB = 1 << 30
ARRAY = 2 * GIB
DEFAULT_SETUPS = (
    "rrmm:pool,rmm:pool,rrmm:managed,rmm:managed,rrmm:managed_pool,rmm:managed_pool,"
    "rrmm:fallback,rrmm:expandable,rrmm:cuda_async,rmm:cuda_async,rrmm:async_managed,"
    "rmm:async_managed,rrmm:prefetch_pool_managed,rmm:prefetch_pool_managed"
)
MANAGED_SETUPS = {"managed", "managed_pool", "fallback", "async_managed", "prefetch_pool_managed"}


def host_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def sync() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


def bandwidth() -> dict[str, float]:
    """Link (pinned memcpy each way) and device (device-to-device copy, read + write) GB/s."""
    import cupy

    n = 4 * GIB
    rt = cupy.cuda.runtime
    h = cupy.cuda.alloc_pinned_memory(n)
    d = cupy.cuda.Memory(n)
    d2 = cupy.cuda.Memory(n)

    def best(fn: Any) -> float:
        times = []
        for _ in range(4):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    h2d = best(lambda: rt.memcpy(d.ptr, h.ptr, n, 1))
    d2h = best(lambda: rt.memcpy(h.ptr, d.ptr, n, 2))
    d2d = best(lambda: rt.memcpy(d2.ptr, d.ptr, n, 3))
    return {"h2d": n / h2d / 1e9, "d2h": n / d2h / 1e9, "device": 2 * n / d2d / 1e9}


def warm_up() -> None:
    """Compiles (or loads from CuPy's cache) the fill and sum kernels for 2 GiB arrays."""
    import cupy

    a = cupy.empty(ARRAY // 4, dtype=cupy.float32)
    a.fill(1.0)
    float(a.sum())
    sync()


def run_case(spec: str, f: float) -> dict[str, Any]:
    lib_name, name = spec.split(":", 1)
    import importlib

    import cupy
    import w8_w9

    total = cupy.cuda.Device().mem_info[1]
    warm_up()  # on CuPy's own pool, before the setup: kernels loaded, then that memory freed
    cupy.get_default_memory_pool().free_all_blocks()
    lib = importlib.import_module(lib_name)
    importlib.import_module(f"{lib_name}.mr")
    if name.startswith("expr="):  # a resource expression, `mr` bound to the library's mr
        what = name[5:]
        lib.mr.set_current_device_resource(eval(what, {"rmm": lib, "mr": lib.mr}))
        w8_w9._cupy_hook(lib)
    else:
        what, setup = w8_w9.SETUPS[name]
        setup(lib)
    n_arrays = max(1, round(f * total / ARRAY))
    out: dict[str, Any] = {"setup": spec, "what": what, "f": f, "arrays": n_arrays,
                           "bytes": n_arrays * ARRAY, "device_bytes": total}
    arrays = []
    sync()
    t0 = time.perf_counter()
    try:
        for i in range(n_arrays):
            a = cupy.empty(ARRAY // 4, dtype=cupy.float32)
            a.fill(float(i % 7 + 1))
            arrays.append(a)
        sync()
    except Exception as e:  # noqa: BLE001 (the refusal is the result)
        out["failed_at_array"] = len(arrays)
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return out
    out["fill_s"] = time.perf_counter() - t0
    sums = []
    for _ in range(3):
        t0 = time.perf_counter()
        total_sum = 0.0
        for a in arrays:
            total_sum += float(a.sum())
        sums.append(time.perf_counter() - t0)
    expected = sum(float(i % 7 + 1) for i in range(n_arrays)) * (ARRAY // 4)
    out["sum_s"] = sums
    out["checked"] = abs(total_sum - expected) <= 1e-3 * expected
    out["stream_s"] = out["fill_s"] + sums[0]
    out["reuse_s"] = out["fill_s"] + sum(sums)
    try:
        big = cupy.empty(4 * GIB // 4, dtype=cupy.float32)
        big.fill(1.0)
        sync()
        out["near_full_4gib"] = "ok"
        del big
    except Exception as e:  # noqa: BLE001
        out["near_full_4gib"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return out


def floor_s(row: dict[str, Any], bw: dict[str, float], reads: int) -> float:
    beyond = max(0, row["bytes"] - row["device_bytes"])
    inside = row["bytes"] - beyond
    link = beyond / (bw["d2h"] * 1e9) + reads * beyond / (bw["h2d"] * 1e9)
    return link + (1 + reads) * inside / (bw["device"] * 1e9)


def run_child(script: str, argv: list[str], ident: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One case in a fresh process (``python SCRIPT ARGV``): its last JSON line, or ``ident``
    with the error (its last line on standard error, or the timeout); ``wall_s`` added."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, script, *argv], check=False, capture_output=True,
                           text=True, timeout=timeout)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        row: dict[str, Any] = json.loads(lines[-1]) if lines else {
            **ident, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    except subprocess.TimeoutExpired:
        row = {**ident, "error": f"timeout {timeout:.0f} s"}
    row["wall_s"] = time.perf_counter() - t0
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run")
    ap.add_argument("--f", type=float, default=0.9)
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--fs", default="0.5,0.9,1.15,1.5,2.0")
    ap.add_argument("--setups", default=DEFAULT_SETUPS)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--out", default="scale.jsonl")
    ap.add_argument("--warm-host", action="store_true",
                    help="before the first F past the device, one throwaway rrmm:managed case "
                    "(the first case that makes host pages pays more: seen 8.3 s against 4.8 s)")
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run_case(args.run, args.f)), flush=True)
        return
    import cupy

    warm_up()
    bw = bandwidth()
    total = cupy.cuda.Device().mem_info[1]
    avail = host_available()
    # The cases run in fresh processes: this one gives back what the measurements held.
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    print(json.dumps({"bandwidth_GBps": bw, "device_bytes": total, "host_available": avail}),
          flush=True)
    del cupy
    rows = []
    with open(args.out, "a") as out_file:
        out_file.write(json.dumps({"bandwidth_GBps": bw, "device_bytes": total,
                                   "host_available": avail}) + "\n")
        for f in [float(x) for x in args.fs.split(",")]:
            beyond = max(0.0, f - 1.0) * total
            if beyond > 0.85 * avail:
                print(f"F={f}: skipped, {beyond / GIB:.0f} GiB beyond the device and "
                      f"{avail / GIB:.0f} GiB available on the host", flush=True)
                continue
            if args.warm_host and f > 1.0:
                args.warm_host = False
                subprocess.run([sys.executable, __file__, "--run", "rrmm:managed", "--f", str(f)],
                               check=False, capture_output=True, text=True, timeout=args.timeout)
            sep = ";" if ";" in args.setups else ","  # expressions hold commas
            for spec in args.setups.split(sep):
                name = spec.split(":", 1)[1]
                if f > 1.0 and name not in MANAGED_SETUPS and f != 1.15 and "expr=" not in name:
                    continue
                row = run_child(__file__, ["--run", spec, "--f", str(f)], {"setup": spec, "f": f},
                                args.timeout)
                if "stream_s" in row:
                    row["floor_stream_s"] = floor_s(row, bw, 1)
                    row["floor_reuse_s"] = floor_s(row, bw, 3)
                rows.append(row)
                out_file.write(json.dumps(row) + "\n")
                out_file.flush()
                print(summary_line(row), flush=True)
    print("\nF     setup                         fill s   sum s   stream s (x floor)   "
          "reuse s (x floor)   4 GiB after")
    for r in rows:
        print(summary_line(r))


def summary_line(r: dict[str, Any]) -> str:
    if "stream_s" not in r:
        return f"{r['f']:<5} {r['setup']:28} {r.get('error', '?')[:90]}"
    return (f"{r['f']:<5} {r['setup']:28} {r['fill_s']:7.2f} {r['sum_s'][0]:7.2f} "
            f"{r['stream_s']:8.2f} ({r['stream_s'] / r['floor_stream_s']:5.1f}x) "
            f"{r['reuse_s']:9.2f} ({r['reuse_s'] / r['floor_reuse_s']:5.1f}x)   "
            f"{r['near_full_4gib'][:40]}{'' if r.get('checked') else '  SUM WRONG'}")


if __name__ == "__main__":
    main()
