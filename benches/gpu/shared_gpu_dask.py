"""W15 with Dask: two workers on one GPU whose tasks alternate, with and without rrmm's ledger.

    python benches/gpu/shared_gpu_dask.py [--mode both] [--out dask.json]

A ``distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True)`` on the one
visible GPU (both workers on device 0), each worker set up by rrmm's plugin
``RRMMSetup(allocator="expandable", external_lib_list=["cupy"])``, in the ledger mode with
``share_gpu=True, idle_after=--idle-after`` too (the worker joins the GPU's ledger, is declared
idle that long after its last task, busy when the next starts; a fresh ``RRMM_LEDGER_DIR`` per
run). Each worker keeps a persistent CuPy array (``--persistent`` of the device, known integers,
checked at the start of each of its tasks and at the end); ``--tasks`` tasks then alternate
between the two workers (pinned: ``workers=[addr], allow_other_workers=False``), one at a time,
``--gap`` seconds apart; each allocates ``--task`` of the device, computes on it in place and
returns a small result. Without the ledger the second worker's task finds the first worker's
pool holding that memory (cached) and runs out; with it the other worker trims (and, with
``--soft-share`` below ``--persistent`` and a task too large for trims alone, an idle worker's
pool sleeps; note that a wake maps its pages without asking the others, so it may then fail).

Reported per mode: tasks done and failed (out of memory or other), the wall time of the task
sequence (and the tasks' own seconds), the persistent arrays' checks, each task's allocation
time, and per worker the ledger's history (``rrmm.shared_gpu.history()`` through
``client.run``): asks with their latencies, bytes trimmed, slept and woken. Every wait has a
timeout; a watchdog ends the worker processes (by pid) and this one if the whole run overruns;
the cluster is closed in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

from dask_guard import guarded_run  # beside this file (sys.path[0])

GIB = 1 << 30


# ------------------------------------------------------------------- functions run on workers


def _fill(x: Any, seed: int) -> None:
    import cupy

    kernel = cupy.ElementwiseKernel(
        "uint64 seed", "float32 y",
        "y = (float)(((unsigned long long)i * 2654435761ULL + seed) % 1000ULL);", "w15_fill")
    kernel(seed, x)


def _checksum(x: Any) -> list[float]:
    """Exact (integers below 1000 summed in float64), in pieces of 32 Mi elements."""
    import cupy

    piece = 32 << 20
    third = x[1::3]
    return [sum(float(x[i:i + piece].sum(dtype=cupy.float64)) for i in range(0, x.size, piece)),
            sum(float(third[i:i + piece].sum(dtype=cupy.float64))
                for i in range(0, third.size, piece))]


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, MemoryError) or "OutOfMemory" in type(error).__name__:
        return True
    text = str(error).lower()
    return any(s in text for s in ("out of memory", "out_of_memory", "memoryallocation",
                                   "bad_alloc"))


def _awake() -> bool:
    """Whether the worker's pool is awake; one that slept wakes at its next allocation."""
    import cupy
    import rrmm.mr

    mr = rrmm.mr.get_current_device_resource()
    if not getattr(mr, "asleep", False):
        return True
    with contextlib.suppress(Exception):  # the caller reports a pool still asleep
        cupy.empty(256, dtype=cupy.uint8)
    return not getattr(mr, "asleep", False)


def make_persistent(fraction: float, seed: int) -> dict[str, Any]:
    """A worker's persistent array, kept on its Worker object between tasks."""
    import cupy
    from distributed import get_worker

    worker = get_worker()
    _free, total = cupy.cuda.runtime.memGetInfo()
    x = cupy.empty(int(total * fraction) // 4, dtype=cupy.float32)
    _fill(x, seed)
    want = _checksum(x)
    vars(worker)["_w15_persistent"] = (x, want)
    allocator = cupy.cuda.get_allocator()
    return {"worker": worker.address, "pid": os.getpid(), "bytes": int(x.nbytes),
            "device_total": int(total),
            "allocator": f"{getattr(allocator, '__module__', None) or '?'}."
            f"{getattr(allocator, '__name__', None) or type(allocator).__name__}"}


def big_task(fraction: float, passes: int, index: int) -> dict[str, Any]:
    """Checks the worker's persistent array, then allocates ``fraction`` of the device,
    computes on it and frees it; never raises (the outcome is the result)."""
    import cupy
    from distributed import get_worker

    worker = get_worker()
    out: dict[str, Any] = {"i": index, "worker": worker.address, "ok": False, "oom": False}
    start = time.perf_counter()
    try:
        if not _awake():
            out["persistent"] = "asleep at task start"
        else:
            x, want = vars(worker)["_w15_persistent"]
            out["persistent"] = "ok" if _checksum(x) == want else "MISMATCH"
        _free, total = cupy.cuda.runtime.memGetInfo()
        t = time.perf_counter()
        big = cupy.empty(int(total * fraction) // 4, dtype=cupy.float32)
        out["alloc_s"] = round(time.perf_counter() - t, 4)
        big.fill(1.0)
        for _ in range(passes):
            big *= 0.5
            big += 1.0
        out["value"] = float(big[:1024].sum())
        del big
        cupy.cuda.runtime.deviceSynchronize()
        out["ok"] = True
    except Exception as error:  # noqa: BLE001 (the outcome is the result)
        out["oom"] = _is_oom(error)
        out["error"] = f"{type(error).__name__}: {error}"[:300]
    out["seconds"] = round(time.perf_counter() - start, 4)
    return out


def check_persistent() -> str:
    from distributed import get_worker

    if not _awake():
        return "asleep"
    x, want = vars(get_worker())["_w15_persistent"]
    return "ok" if _checksum(x) == want else "MISMATCH"


def ledger_history() -> Any:
    import rrmm.shared_gpu

    try:
        return rrmm.shared_gpu.history()
    except Exception as error:  # noqa: BLE001 (a worker outside a ledger says why)
        return {"error": f"{type(error).__name__}: {error}"[:200]}


def ledger_status() -> Any:
    import rrmm.shared_gpu

    try:
        return rrmm.shared_gpu.status()
    except Exception as error:  # noqa: BLE001 (a worker outside a ledger says why)
        return {"error": f"{type(error).__name__}: {error}"[:200]}


# ----------------------------------------------------------------------------- the client


def _register(client: Any, plugin: Any) -> None:
    if hasattr(client, "register_plugin"):
        client.register_plugin(plugin)
    else:  # distributed before 2023.9
        client.register_worker_plugin(plugin)


def _ms(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median_ms": None, "max_ms": None}
    return {"n": len(values), "median_ms": round(statistics.median(values) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1)}


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from distributed import Client, LocalCluster
    from rrmm.dask import RRMMSetup

    options: dict[str, Any] = {"allocator": "expandable", "external_lib_list": ["cupy"]}
    if mode == "ledger":
        options["share_gpu"] = {"soft_share": args.soft_share} if args.soft_share else True
        options["idle_after"] = args.idle_after
    plugin = RRMMSetup(**options)
    out: dict[str, Any] = {"mode": mode, "plugin": {k: v for k, v in options.items()}}
    unset = ("RRMM_SHARE_GPU", "RRMM_AS_RMM")
    with guarded_run(f"W15 dask {mode}", args.run_timeout, f"w15-dask-{mode}-", unset) as pids:
        cluster = client = None
        try:
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None, memory_limit=0)
            client = Client(cluster, timeout=f"{int(args.timeout)}s")
            client.wait_for_workers(2, timeout=args.timeout)
            pids.extend(int(p) for p in client.run(os.getpid).values())
            _register(client, plugin)
            workers = sorted(client.scheduler_info()["workers"])

            def on(worker: str, fn: Any, *fargs: Any) -> Any:
                return client.submit(fn, *fargs, workers=[worker], allow_other_workers=False,
                                     pure=False).result(timeout=args.timeout)

            out["persistent"] = [on(w, make_persistent, args.persistent, 100 + i)
                                 for i, w in enumerate(workers)]
            time.sleep(args.gap)
            tasks = []
            t0 = time.perf_counter()
            for i in range(args.tasks):
                tasks.append(on(workers[i % 2], big_task, args.task, args.passes, i))
                if i + 1 < args.tasks:
                    time.sleep(args.gap)
            out["wall_s"] = round(time.perf_counter() - t0, 3)
            out["gaps_s"] = round(args.gap * (args.tasks - 1), 3)
            out["tasks"] = tasks
            out["final_checks"] = {w: on(w, check_persistent) for w in workers}
            out["history"] = client.run(ledger_history)
            out["ledger_status"] = client.run(ledger_status)
        except Exception as error:  # noqa: BLE001 (reported in the summary)
            out["error"] = f"{type(error).__name__}: {error}"[:500]
        finally:
            for closing in (client, cluster):
                if closing is not None:
                    try:
                        closing.close()
                    except Exception as error:  # noqa: BLE001 (reported; the watchdog stays)
                        out.setdefault("close_errors", []).append(str(error)[:200])
    return out


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    tasks = r.get("tasks", [])
    events = [e for h in (r.get("history") or {}).values() if isinstance(h, list) for e in h]

    def kind(k: str) -> list[dict[str, Any]]:
        return [e for e in events if e.get("kind") == k]

    checks = [t.get("persistent") for t in tasks] + list((r.get("final_checks") or {}).values())
    return {
        "mode": r["mode"],
        "tasks": len(tasks),
        "failed": sum(not t["ok"] for t in tasks),
        "failed_oom": sum(bool(t["oom"]) for t in tasks),
        "wall_s": r.get("wall_s"),
        "gaps_s": r.get("gaps_s"),
        "task_s": round(sum(t["seconds"] for t in tasks), 3),
        "alloc_ms": _ms([t["alloc_s"] for t in tasks if "alloc_s" in t]),
        "persistent_checks": len([c for c in checks if c]),
        "persistent_bad": [c for c in checks if c and c != "ok"],
        "asks": _ms([e["seconds"] for e in kind("asked")]),
        "trimmed_gib": round(sum(e.get("given", 0) for e in kind("gave")) / GIB, 2),
        "slept_gib": round(sum(e.get("given", 0) for e in kind("slept")) / GIB, 2),
        "woken_gib": round(sum(e.get("bytes", 0) for e in kind("woke")) / GIB, 2),
        "refused": len(kind("refused")),
        "error": r.get("error"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--mode", choices=["ledger", "plain", "both"], default="both")
    p.add_argument("--persistent", type=float, default=0.20, help="each worker's kept fraction")
    p.add_argument("--task", type=float, default=0.50, help="each task's fraction of the device")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--gap", type=float, default=1.0, help="seconds between tasks")
    p.add_argument("--idle-after", type=float, default=0.5)
    p.add_argument("--soft-share", default=None, help="each worker's soft share (e.g. 15%%)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per wait")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds per mode, in all")
    p.add_argument("--out")
    args = p.parse_args()
    if 2 * args.persistent + args.task >= 1.0:
        print(f"W15 dask: two persistent arrays and a task ({2 * args.persistent + args.task:.2f}"
              " of the device) leave nothing for contexts: the task cannot fit", file=sys.stderr)
    modes = ["plain", "ledger"] if args.mode == "both" else [args.mode]
    results = [run(m, args) for m in modes]
    rows = [summarize(r) for r in results]
    print(f"W15 dask: 2 workers on one GPU, persistent {args.persistent:.2f} D each, tasks "
          f"{args.task:.2f} D alternating, {args.tasks} tasks {args.gap} s apart")
    for s in rows:
        a = s["asks"]
        print(f"W15 dask {s['mode']:6}: tasks {s['tasks']} failed {s['failed']} "
              f"(OOM {s['failed_oom']}); wall {s['wall_s']} s (gaps {s['gaps_s']} s, tasks "
              f"{s['task_s']} s); alloc ms med/max {s['alloc_ms']['median_ms']}/"
              f"{s['alloc_ms']['max_ms']}; persistent checks {s['persistent_checks']} bad "
              f"{len(s['persistent_bad'])}; asks {a['n']} (med {a['median_ms']} ms, max "
              f"{a['max_ms']} ms); trimmed {s['trimmed_gib']} GiB, slept {s['slept_gib']} GiB, "
              f"woken {s['woken_gib']} GiB" + (f"; error {s['error']}" if s["error"] else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "W15 dask", "argv": sys.argv[1:], "summary": rows,
                       "runs": results}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
