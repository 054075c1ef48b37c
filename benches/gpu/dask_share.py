"""Issue 49, Dask: a CuPy array handed from one worker to another on the same GPU, copied (Dask's
own serializers) or attached (``RRMMSetup(share_arrays=True)``).

    python benches/gpu/dask_share.py [--sizes 2,4,8] [--repeats 3] [--modes copy,share]
                                     [--out dask_share.json]

Per mode a fresh ``distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
memory_limit=0)`` on GPU 0 (both workers), each worker set up by
``RRMMSetup(allocator="expandable", external_lib_list="cupy")``, with ``share_arrays=True`` in
the ``share`` mode, in a fresh ``RRMM_LEDGER_DIR``. One warm-up hand-over (256 MiB), then per
size ``--repeats`` times: worker A makes a float32 array of that many GiB (all ones), worker B
sums it (float64: exactly the element count) and the wall time of B's task (the transfer and
the sum) is taken; the same sum on A (no transfer) is the reference. Device memory in use is
sampled every 50 ms (``nvidia-smi``; else the workers' ``cupy.cuda.runtime.memGetInfo``) and
the peak of each size above the level before it is reported (both workers together).

Prints a markdown table and writes the rows as JSON (``--out``). Each row's error is caught and
reported; every wait has a timeout; a watchdog ends the workers and their nannies (by pid) and
this process if a mode overruns ``--mode-timeout``; the cluster is closed in ``finally``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from dask_guard import guarded_run  # beside this file (sys.path[0])

GIB = 1 << 30


# ------------------------------------------------------------------- functions run on workers


def make(nbytes: int) -> Any:
    import cupy

    x = cupy.empty(nbytes // 4, dtype="f4")
    x.fill(1)
    cupy.cuda.Device().synchronize()
    return x


def consume_sum(x: Any) -> tuple[float, str]:
    """The sum (float64), and ``attached`` when this worker holds an attachment to a peer's
    pool (the array came by name), ``copied`` otherwise."""
    import cupy
    from rrmm import _dask_share

    total = float(x.sum(dtype="f8"))
    cupy.cuda.Device().synchronize()
    return total, "attached" if _dask_share._attachments else f"copied ({type(x.data.mem).__name__})"


def device_used() -> int:
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)


def collect() -> int:
    gc.collect()
    return 0


# ------------------------------------------------------------------- sampling


class Sampler:
    """Device memory in use, sampled in a thread; ``peak_since(mark)``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.use_smi = shutil.which("nvidia-smi") is not None
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def read(self) -> int | None:
        try:
            if self.use_smi:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                     "-i", "0"], capture_output=True, text=True, timeout=5, check=True)
                return int(float(out.stdout.strip().splitlines()[0]) * (1 << 20))
            used = self.client.run(device_used)
            return max(used.values()) if used else None
        except Exception:  # noqa: BLE001 (a missed sample)
            return None

    def run(self) -> None:
        while not self.stop.is_set():
            value = self.read()
            if value is not None:
                self.samples.append((time.perf_counter(), value))
            self.stop.wait(0.05)

    def now(self) -> int:
        value = self.read()
        return value if value is not None else (self.samples[-1][1] if self.samples else 0)

    def peak_since(self, t0: float) -> int:
        return max((v for t, v in self.samples if t >= t0), default=0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


# ------------------------------------------------------------------- one mode


def run_mode(mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from distributed import Client, LocalCluster, wait
    from rrmm.dask import RRMMSetup

    rows: list[dict[str, Any]] = []
    label, prefix = f"dask_share {mode}", f"dask-share-{mode}-"
    with guarded_run(label, args.mode_timeout, prefix) as pids:
        cluster = client = sampler = None
        timeout = args.timeout
        try:
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None, memory_limit=0)
            client = Client(cluster, timeout=f"{int(timeout)}s")
            client.wait_for_workers(2, timeout=timeout)
            pids.extend(int(p) for p in client.run(os.getpid).values())
            # The nannies (processes of their own, unless they live in this one: LocalCluster's).
            pids.extend(int(p) for p in client.run(os.getppid).values() if int(p) != os.getpid())
            client.register_plugin(RRMMSetup(allocator="expandable", external_lib_list="cupy",
                                             share_arrays=mode == "share"))
            a, b = sorted(client.scheduler_info()["workers"])
            sampler = Sampler(client)

            def hand_over(nbytes: int) -> dict[str, Any]:
                made = client.submit(make, nbytes, workers=[a], allow_other_workers=False,
                                     pure=False)
                t0 = time.perf_counter()
                wait(made, timeout=timeout)
                t1 = time.perf_counter()
                local = client.submit(consume_sum, made, workers=[a], allow_other_workers=False,
                                      pure=False).result(timeout=timeout)
                t2 = time.perf_counter()
                total, memory = client.submit(consume_sum, made, workers=[b],
                                              allow_other_workers=False,
                                              pure=False).result(timeout=timeout)
                t3 = time.perf_counter()
                del made
                client.run(collect)
                return {"make_s": t1 - t0, "local_s": t2 - t1, "handoff_s": t3 - t2,
                        "ok": total == nbytes // 4 and local[0] == total, "memory": memory}

            hand_over(256 << 20)  # warm-up: pools, kernels, connections, attachments
            for size in args.sizes:
                nbytes = int(size * GIB)
                row: dict[str, Any] = {"mode": mode, "size_gib": size}
                try:
                    time.sleep(0.3)
                    before = sampler.now()
                    t_row = time.perf_counter()
                    runs = [hand_over(nbytes) for _ in range(args.repeats)]
                    time.sleep(0.2)
                    peak = sampler.peak_since(t_row)
                    handoff = [r["handoff_s"] for r in runs]
                    row.update({
                        "handoff_s": [round(s, 4) for s in handoff],
                        "handoff_median_s": round(statistics.median(handoff), 4),
                        "handoff_min_s": round(min(handoff), 4),
                        "make_median_s": round(statistics.median(r["make_s"] for r in runs), 4),
                        "local_median_s": round(statistics.median(r["local_s"] for r in runs), 4),
                        "peak_used_gib": round(peak / GIB, 2),
                        "peak_above_before_gib": round(max(peak - before, 0) / GIB, 2),
                        "attached": all(r["memory"] == "attached" for r in runs),
                        "ok": all(r["ok"] for r in runs),
                        "memory_kind": runs[-1]["memory"],
                    })
                except Exception as error:  # noqa: BLE001 (reported in the row)
                    row["error"] = f"{type(error).__name__}: {error}"[:400]
                rows.append(row)
                print(json.dumps(row), flush=True)
        except Exception as error:  # noqa: BLE001 (reported as a row)
            rows.append({"mode": mode, "error": f"{type(error).__name__}: {error}"[:400]})
            print(json.dumps(rows[-1]), flush=True)
        finally:
            if sampler is not None:
                sampler.close()
            for closing in (client, cluster):
                if closing is not None:
                    try:
                        closing.close()
                    except Exception as error:  # noqa: BLE001 (reported; the watchdog stays)
                        print(f"dask_share {mode}: closing: {error}", flush=True)
            for pid in pids:  # anything the close left behind
                try:
                    os.kill(pid, 0)
                except OSError:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("mode", "GiB", "hand-over s (median)", "min", "sum on A s", "make s",
            "peak GiB (above before)", "attached", "ok", "error")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(v) for v in (
            r.get("mode"), r.get("size_gib", "-"), r.get("handoff_median_s", "-"),
            r.get("handoff_min_s", "-"), r.get("local_median_s", "-"),
            r.get("make_median_s", "-"),
            f"{r['peak_used_gib']} ({r['peak_above_before_gib']})" if "peak_used_gib" in r
            else "-", r.get("attached", "-"), r.get("ok", "-"), r.get("error", ""),
        )) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="2,4,8", help="GiB per array, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="copy,share")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per wait")
    p.add_argument("--mode-timeout", type=float, default=110.0, help="seconds per mode")
    p.add_argument("--out", default="dask_share.json")
    args = p.parse_args()
    args.sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in ("copy", "share") for m in modes):
        p.error(f"--modes: copy and/or share, not {args.modes!r}")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for mode in modes:
        rows.extend(run_mode(mode, args))
    result = {"sizes_gib": args.sizes, "repeats": args.repeats, "rows": rows,
              "seconds": round(time.perf_counter() - t0, 1), "python": sys.version.split()[0]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print()
    print(table(rows))
    print(f"\n{result['seconds']} s; JSON: {args.out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
