"""W4-W6: the cost of the framework hooks (docs/benchmarks.md), rrmm vs RMM vs the native allocator.

    python benches/python/bench_hooks.py            # full run (about 2-3 minutes on an H100)
    python benches/python/bench_hooks.py --quick    # a smoke run (seconds per framework)
    python benches/python/bench_hooks.py --only cupy,numba --json out.json

Each (framework, allocator) configuration runs in its own subprocess (PyTorch and Numba choose
their allocator once per process); configurations are interleaved over rounds (A B C, then C B A,
...), each process warms up and then times several repetitions, and the table shows medians in
ns per operation (ms per loop for the temporaries and training loops) and ratios. The RMM column
needs `rmm` (RAPIDS) installed; without it that column is skipped. rrmm's hooks run over an rrmm
`PoolMemoryResource`, RMM's over RMM's `PoolMemoryResource`.

Workloads:
  W4 cupy.empty(1 MiB) loop; temporaries: N x ((x*2+1)*x-3).sum() on 1M float32
  W5 torch.empty(1 MiB, device="cuda") loop; a small MLP training loop
  W6 numba cuda.device_array(1 MiB) loop
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = ("native", "rrmm", "rmm")
FRAMEWORKS = ("cupy", "torch", "numba")
POOL_BYTES = 1 << 30


# --------------------------------------------------------------------------- workers


def _setup_pool(config):
    """Makes the current device resource a pool of the library `config` names; returns a note."""
    if config == "rrmm":
        import rrmm

        mr = getattr(rrmm, "mr", None)
        if mr is None or not hasattr(mr, "PoolMemoryResource"):
            return "rrmm.mr.PoolMemoryResource missing: rrmm column over its default resource"
        mr.set_current_device_resource(
            mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=POOL_BYTES)
        )
        return ""
    if config == "rmm":
        import rmm

        rmm.mr.set_current_device_resource(
            rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=POOL_BYTES)
        )
        return ""
    return ""


def _time_loop(body, iters, reps, warmup, sync):
    """Runs `body(iters)` `warmup` times then `reps` times; returns ns per iteration each time."""
    for _ in range(warmup):
        body(iters)
        sync()
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter_ns()
        body(iters)
        sync()
        out.append((time.perf_counter_ns() - t0) / iters)
    return out


def worker_cupy(config, a):
    import cupy

    note = _setup_pool("rrmm" if config == "rrmm_c" else config)
    if config == "rrmm":
        from rrmm import _rrmm
        from rrmm.allocators.cupy import rmm_cupy_allocator

        cupy.cuda.set_allocator(rmm_cupy_allocator)
        note = (note + "; " if note else "") + f"stream lookup: {_rrmm.cupy_stream_lookup()}"
    elif config == "rrmm_c":
        from rrmm.allocators.cupy import rrmm_cupy_unowned_allocator

        cupy.cuda.set_allocator(rrmm_cupy_unowned_allocator)
    elif config == "rmm":
        from rmm.allocators.cupy import rmm_cupy_allocator

        cupy.cuda.set_allocator(rmm_cupy_allocator)
    sync = cupy.cuda.get_current_stream().synchronize
    empty, u8 = cupy.empty, cupy.uint8

    def empties(n):
        for _ in range(n):
            empty(1 << 20, dtype=u8)

    alloc = cupy.cuda.alloc  # the current allocator alone: malloc, MemoryPointer, free

    def allocs(n):
        for _ in range(n):
            alloc(1 << 20)

    x = cupy.random.rand(1_000_000).astype(cupy.float32)

    def temporaries(n):
        for _ in range(n):
            ((x * 2 + 1) * x - 3).sum()

    suffix = " [unowned]" if config == "rrmm_c" else ""
    return note, {
        "W4 cupy.empty 1MiB (ns)" + suffix: _time_loop(empties, a.iters, a.reps, 2, sync),
        "W4 cupy.cuda.alloc 1MiB (ns)" + suffix: _time_loop(allocs, a.iters, a.reps, 2, sync),
        f"W4 temporaries x{a.temp_iters} (ms)" + suffix: [
            v * a.temp_iters / 1e6
            for v in _time_loop(temporaries, a.temp_iters, a.reps, 1, sync)
        ],
    }


def worker_torch(config, a):
    import torch

    if config == "rrmm":
        from rrmm.allocators.torch import rmm_torch_allocator

        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    elif config == "rmm":
        from rmm.allocators.torch import rmm_torch_allocator

        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    note = _setup_pool(config)
    sync = torch.cuda.synchronize
    empty, u8 = torch.empty, torch.uint8

    def empties(n):
        for _ in range(n):
            empty(1 << 20, dtype=u8, device="cuda")

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(128, 256, device="cuda")
    target = torch.randint(0, 10, (128,), device="cuda")

    def train(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            opt.step()

    return note, {
        "W5 torch.empty 1MiB (ns)": _time_loop(empties, a.iters, a.reps, 2, sync),
        f"W5 training x{a.train_iters} (ms)": [
            v * a.train_iters / 1e6 for v in _time_loop(train, a.train_iters, a.reps, 1, sync)
        ],
    }


def worker_numba(config, a):
    import numpy as np
    from numba import cuda

    if config == "rrmm":
        from rrmm.allocators.numba import RMMNumbaManager

        cuda.set_memory_manager(RMMNumbaManager)
    elif config == "rmm":
        from rmm.allocators.numba import RMMNumbaManager

        cuda.set_memory_manager(RMMNumbaManager)
    note = _setup_pool(config)
    sync = cuda.synchronize
    device_array, u8 = cuda.device_array, np.uint8

    def arrays(n):
        for _ in range(n):
            device_array(1 << 20, dtype=u8)

    return note, {
        "W6 numba device_array 1MiB (ns)": _time_loop(arrays, a.iters, a.reps, 2, sync),
    }


WORKERS = {"cupy": worker_cupy, "torch": worker_torch, "numba": worker_numba}


# --------------------------------------------------------------------------- driver


def available(module):
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_worker(framework, config, a):
    cmd = [
        sys.executable, os.path.abspath(__file__), "--worker", framework, config,
        "--iters", str(a.iters), "--reps", str(a.reps), "--temp-iters", str(a.temp_iters),
        "--train-iters", str(a.train_iters), "--cpu", str(a.cpu),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"{framework}/{config} failed: " + " | ".join(tail)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), ""
    return None, f"{framework}/{config}: no result"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few iterations, one round")
    p.add_argument("--only", default=",".join(FRAMEWORKS), help="frameworks, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of processes")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per process")
    p.add_argument("--iters", type=int, default=20000, help="allocations per repetition")
    p.add_argument("--temp-iters", type=int, default=2000)
    p.add_argument("--train-iters", type=int, default=100)
    p.add_argument("--timeout", type=int, default=300, help="seconds per worker process")
    p.add_argument("--json", help="write all samples here")
    p.add_argument("--stat", choices=("median", "best"), default="median",
                   help="median of all repetitions, or the fastest process's median")
    p.add_argument("--cpu", type=int, default=1,
                   help="pin every worker process to this CPU (-1: no pinning)")
    p.add_argument("--cupy-unowned", action="store_true",
                   help="also time rrmm_cupy_unowned_allocator (rows marked [unowned]; their "
                        "native column is the plain native figure)")
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "CONFIG"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick:
        a.rounds, a.reps, a.iters, a.temp_iters, a.train_iters = 1, 3, 2000, 200, 20

    if a.worker:
        framework, config = a.worker
        if a.cpu >= 0 and hasattr(os, "sched_setaffinity"):
            # Every worker on the same core: on shared multi-socket hosts, where a process lands
            # changes its speed by up to 1.8x, which swamps the differences measured here.
            try:
                os.sched_setaffinity(0, {a.cpu})
            except OSError:
                pass
        note, results = WORKERS[framework](config, a)
        print(json.dumps({"framework": framework, "config": config, "note": note,
                          "results": results}))
        return

    frameworks = [f for f in a.only.split(",") if f]
    have_rmm = available("rmm")
    samples = {}  # (workload, config) -> [ns]
    per_process = {}  # (workload, config) -> [median of each process]
    notes = []
    for framework in frameworks:
        module = {"cupy": "cupy", "torch": "torch", "numba": "numba"}[framework]
        if not available(module):
            notes.append(f"{framework}: not installed, skipped")
            continue
        configs = [c for c in CONFIGS if c != "rmm" or have_rmm]
        if framework == "cupy" and a.cupy_unowned:
            configs.insert(2, "rrmm_c")  # rrmm_cupy_unowned_allocator (RMM's design, in Rust)
        if not have_rmm:
            notes.append(f"{framework}: rmm not installed, RMM column skipped")
        for r in range(a.rounds):
            order = configs if r % 2 == 0 else list(reversed(configs))
            for config in order:
                out, err = run_worker(framework, config, a)
                if err:
                    notes.append(err)
                    continue
                if out["note"]:
                    notes.append(f"{framework}/{config}: {out['note']}")
                column = "rrmm" if config == "rrmm_c" else config
                for workload, values in out["results"].items():
                    samples.setdefault((workload, column), []).extend(values)
                    per_process.setdefault((workload, column), []).append(
                        statistics.median(values))

    workloads = list(dict.fromkeys(w for w, _ in samples))
    if a.stat == "best":
        # The fastest process of each configuration: on hosts whose speed drifts between
        # phases (seen: 1.8x), the quiet phase is the comparable one.
        med = {k: min(v) for k, v in per_process.items()}
    else:
        med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"[{a.stat}: " + ("fastest per-process median" if a.stat == "best" else
                            "median of all repetitions") + "]")
    header = f"{'workload':34} {'native':>11} {'rrmm':>11} {'rmm':>11} {'rrmm/native':>12} " \
             f"{'rmm/native':>11} {'rrmm/rmm':>9}"
    print(header)
    print("-" * len(header))

    def cell(v):
        return f"{v:11.1f}" if v is not None else f"{'-':>11}"

    def ratio(x, y, width):
        return f"{x / y:{width}.2f}" if x is not None and y else f"{'-':>{width}}"

    for w in workloads:
        base = w.replace(" [unowned]", "")
        n, m = med.get((base, "native")), med.get((base, "rmm"))
        r = med.get((w, "rrmm"))
        print(f"{w:34} {cell(n)} {cell(r)} {cell(m)} {ratio(r, n, 12)} {ratio(m, n, 11)} "
              f"{ratio(r, m, 9)}")
    for note in dict.fromkeys(notes):
        print("note:", note)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"samples": {f"{w}|{c}": v for (w, c), v in samples.items()},
                       "per_process": {f"{w}|{c}": v for (w, c), v in per_process.items()},
                       "medians": {f"{w}|{c}": v for (w, c), v in med.items()},
                       "notes": notes, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
