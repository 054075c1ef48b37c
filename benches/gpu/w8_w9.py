"""W9 and W8 (benchmarks.md): rapids-singlecell's own Harmony, and a single-cell-like CuPy
pipeline, under each allocator setup (``--workload harmony|pipeline``).

One process per (library, setup), median of --reps timed runs after one warm-up. The
rapids-singlecell files travel as a folder made from its wheel (scripts/gpu_prepare.sh w9: only
the Harmony subpackage, its CUDA extensions and `_utils`); its package ``__init__`` needs cuML,
so the parents are stub packages and only ``preprocessing._harmony`` is loaded.

    python3 w9_harmony.py --rsc .w9 --run rrmm:pool        # one setup, one JSON line
    python3 w9_harmony.py --rsc .w9 --all SETUP,...         # each in its own process, rounds
                                                            # alternating, table last

A setup is LIB:NAME with LIB one of rrmm, rmm, cupy; NAME a key of SETUPS (or, for rrmm, any
expression after ``expr=`` evaluated with ``rmm`` bound to the library, returning a resource).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

# name -> (what it does, setup(lib)); each sets the library's resource and CuPy's allocator.
Setup = Callable[[Any], None]


def _cupy_hook(lib: Any) -> None:
    import importlib

    import cupy

    hook = importlib.import_module(f"{lib.__name__}.allocators.cupy")
    cupy.cuda.set_allocator(hook.rmm_cupy_allocator)


def _reinit(**kw: Any) -> Setup:
    def setup(lib: Any) -> None:
        lib.reinitialize(**kw)
        _cupy_hook(lib)

    return setup


def _resource(make: Callable[[Any], Any]) -> Setup:
    def setup(lib: Any) -> None:
        lib.mr.set_current_device_resource(make(lib.mr))
        _cupy_hook(lib)

    return setup


SETUPS: dict[str, tuple[str, Setup]] = {
    "pool": ("reinitialize(pool_allocator=True)", _reinit(pool_allocator=True)),
    "cuda": ("reinitialize() (cuda, no pool)", _reinit()),
    "managed": (
        "reinitialize(managed_memory=True, pool_allocator=False) (the documents' snippet)",
        _reinit(managed_memory=True, pool_allocator=False),
    ),
    "managed_pool": (
        "reinitialize(managed_memory=True, pool_allocator=True)",
        _reinit(managed_memory=True, pool_allocator=True),
    ),
    "fallback": (
        "reinitialize(pool_allocator='fallback'): pool over the device, then managed memory",
        _reinit(pool_allocator="fallback"),
    ),
    "managed_nocache": (
        "ManagedMemoryResource(cache_limit=0, placement=False): RMM's behaviour",
        _resource(lambda mr: mr.ManagedMemoryResource(cache_limit=0, placement=False)),
    ),
    "managed_placement_only": (
        "ManagedMemoryResource(cache_limit=0): placement, no reuse",
        _resource(lambda mr: mr.ManagedMemoryResource(cache_limit=0)),
    ),
    "managed_cache_only": (
        "ManagedMemoryResource(placement=False): reuse, no placement",
        _resource(lambda mr: mr.ManagedMemoryResource(placement=False)),
    ),
    "cuda_async": ("CudaAsyncMemoryResource()", _resource(lambda mr: mr.CudaAsyncMemoryResource())),
    "arena": (
        "ArenaMemoryResource(CudaMemoryResource())",
        _resource(lambda mr: mr.ArenaMemoryResource(mr.CudaMemoryResource())),
    ),
    "expandable": (
        "reinitialize(pool_allocator='expandable') (rrmm only)",
        _reinit(pool_allocator="expandable"),
    ),
    "async_managed": (
        "mr.experimental.CudaAsyncManagedMemoryResource()",
        _resource(lambda mr: mr.experimental.CudaAsyncManagedMemoryResource()),
    ),
    "prefetch_pool_managed": (
        "PrefetchResourceAdaptor(PoolMemoryResource(ManagedMemoryResource())) (cudf-polars)",
        _resource(
            lambda mr: mr.PrefetchResourceAdaptor(mr.PoolMemoryResource(mr.ManagedMemoryResource()))
        ),
    ),
}


CUPY_SETUPS = {
    "pool": "CuPy's MemoryPool (default)",
    "managed_pool": "CuPy MemoryPool(malloc_managed)",
    "managed": "CuPy malloc_managed per call, no pool",
    "managed_prefetch": "CuPy malloc_managed per call + prefetch to the device, no pool",
    "cuda": "CuPy cudaMalloc per call, no pool",
}


def _cupy_setup(name: str) -> None:
    """CuPy-only setups: the frameworks' own answers, for comparison."""
    import cupy

    if name == "managed_pool":
        cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)
    elif name == "managed":
        cupy.cuda.set_allocator(cupy.cuda.malloc_managed)
    elif name == "cuda":
        cupy.cuda.set_allocator(None)
    elif name == "managed_prefetch":
        runtime = cupy.cuda.runtime

        def alloc(n: int) -> Any:
            mp = cupy.cuda.malloc_managed(n)
            if n:
                try:
                    runtime.memPrefetchAsync(mp.ptr, n, 0, 0)
                except TypeError:
                    pass
            return mp

        cupy.cuda.set_allocator(alloc)


def load_harmonize(rsc: str) -> Callable[..., Any]:
    """rapids_singlecell.preprocessing._harmony.harmonize without the package __init__s."""
    sys.path.insert(0, rsc)
    for name in ("rapids_singlecell", "rapids_singlecell.preprocessing"):
        stub = types.ModuleType(name)
        stub.__path__ = [os.path.join(rsc, *name.split("."))]
        sys.modules[name] = stub
    try:
        import dask.array
    except ImportError:
        dask = types.ModuleType("dask")
        dask.__path__ = []
        array = types.ModuleType("dask.array")
        array.Array = type("Array", (), {})  # type: ignore[attr-defined]
        sys.modules["dask"] = dask
        sys.modules["dask.array"] = array
    from rapids_singlecell.preprocessing._harmony import harmonize

    return harmonize


def pipeline(counts: Any, batches: Any, n_pcs: int = 50, n_clusters: int = 100,
             iters: int = 20) -> Any:
    """W8: normalize, log1p, highly variable genes, scale, PCA by covariance and eigh, then a
    harmony-like loop (soft k-means with per-batch corrections): many short-lived temporaries."""
    import cupy as cp

    x = counts / counts.sum(axis=1, keepdims=True) * 1e4
    x = cp.log1p(x)
    var = x.var(axis=0)
    top = cp.argsort(var)[-2000:]
    x = x[:, top]
    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
    cov = x.T @ x / x.shape[0]
    _, vecs = cp.linalg.eigh(cov)
    z = x @ vecs[:, -n_pcs:]
    z /= cp.linalg.norm(z, axis=1, keepdims=True)
    centroids = z[:: max(1, z.shape[0] // n_clusters)][:n_clusters]
    onehot = cp.eye(int(batches.max()) + 1, dtype=z.dtype)[batches]
    for _ in range(iters):
        dist = 2 * (1 - z @ centroids.T)
        r = cp.exp(-dist / 0.1)
        r /= r.sum(axis=1, keepdims=True)
        centroids = r.T @ z
        centroids /= cp.linalg.norm(centroids, axis=1, keepdims=True)
        o = onehot.T @ r
        e = onehot.sum(axis=0)[:, None] * r.sum(axis=0)[None, :] / z.shape[0]
        penalty = cp.power((e + 1) / (o + 1), 2.0)
        r = r * (onehot @ penalty)
        beta = cp.linalg.solve(onehot.T @ onehot + cp.eye(onehot.shape[1], dtype=z.dtype),
                               onehot.T @ z)
        z = z - 0.1 * (onehot @ beta) * r.sum(axis=1, keepdims=True)
    return z


def run_one(spec: str, rsc: str, cells: int, dims: int, batches: int, reps: int,
            workload: str = "harmony") -> dict[str, Any]:
    lib_name, _, name = spec.partition(":")
    import cupy
    import numpy as np
    import pandas as pd

    if lib_name == "cupy":
        what = CUPY_SETUPS[name or "pool"]
        _cupy_setup(name or "pool")
    else:
        import importlib

        lib = importlib.import_module(lib_name)
        importlib.import_module(f"{lib_name}.mr")
        try:
            importlib.import_module(f"{lib_name}.mr.experimental")
        except ImportError:
            pass
        if name.startswith("expr="):
            what = name[5:]
            mr = eval(what, {"rmm": lib, "mr": lib.mr})
            if mr is not None:
                lib.mr.set_current_device_resource(mr)
            _cupy_hook(lib)
        else:
            what, setup = SETUPS[name]
            setup(lib)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, batches, cells)
    if workload == "harmony":
        harmonize = load_harmonize(rsc)
        z = cupy.asarray(rng.standard_normal((cells, dims), dtype=np.float32))
        batch = pd.DataFrame({"batch": pd.Categorical(labels.astype(str))})

        def work() -> Any:
            return harmonize(z, batch, "batch", rng=0)
    else:
        counts = cupy.asarray(rng.poisson(0.5, (cells, dims)).astype(np.float32)) + 1
        labels_d = cupy.asarray(labels)

        def work() -> Any:
            return pipeline(counts, labels_d)

    times = []
    for i in range(reps + 1):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = work()
        cupy.cuda.Device().synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    checksum = float(cupy.abs(out).sum())
    free, total = cupy.cuda.runtime.memGetInfo()
    return {
        "setup": spec,
        "workload": workload,
        "what": what,
        "seconds": statistics.median(times),
        "times": times,
        "checksum": checksum,
        "device_used_after": total - free,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rsc", default=".w9", help="folder holding rapids_singlecell's files")
    ap.add_argument("--run", help="one setup LIB:NAME in this process")
    ap.add_argument("--all", help="comma-separated setups, each in its own process")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds with --all")
    ap.add_argument("--workload", choices=["harmony", "pipeline"], default="harmony")
    ap.add_argument("--cells", type=int, default=200_000)
    ap.add_argument("--dims", type=int, default=None,
                    help="embedding dims (harmony, default 50) or genes (pipeline, default 4000)")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", help="JSON lines file (with --all)")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if args.dims is None:
        args.dims = 50 if args.workload == "harmony" else 4000
    common = ["--workload", args.workload, "--rsc", args.rsc, "--cells", str(args.cells), "--dims", str(args.dims),
              "--batches", str(args.batches), "--reps", str(args.reps)]
    if args.run:
        print(json.dumps(run_one(args.run, args.rsc, args.cells, args.dims, args.batches,
                                 args.reps, args.workload)))
        return
    specs = [s for s in (args.all or "").split(",") if s]
    rows: dict[str, list[float]] = {s: [] for s in specs}
    whats: dict[str, str] = {}
    out = open(args.out, "a") if args.out else None  # noqa: SIM115
    for rnd in range(args.rounds):
        order = specs if rnd % 2 == 0 else list(reversed(specs))
        for spec in order:
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--run", spec, *common],
                    check=False, capture_output=True, text=True, timeout=args.timeout,
                )
            except subprocess.TimeoutExpired:
                print(f"{spec}: timed out", flush=True)
                continue
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                print(f"{spec}: failed rc={proc.returncode}\n{proc.stderr[-1500:]}", flush=True)
                continue
            rec = json.loads(lines[-1])
            rec["round"] = rnd
            rows[spec].append(rec["seconds"])
            whats[spec] = rec["what"]
            print(json.dumps(rec), flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
    base = next((statistics.median(v) for s, v in rows.items() if s == "rrmm:pool" and v), None)
    label = "W9 Harmony" if args.workload == "harmony" else "W8 pipeline"
    print(f"\n{label} {args.cells} cells x {args.dims} dims, {args.batches} batches; median of"
          f" {args.reps} after a warm-up, per process; median over {args.rounds} round(s)")
    print(f"{'setup':28} {'seconds':>8} {'vs rrmm:pool':>12}  what")
    for spec, v in rows.items():
        if not v:
            print(f"{spec:28} {'failed':>8}")
            continue
        med = statistics.median(v)
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"{spec:28} {med:8.3f} {ratio:>12}  {whats.get(spec, '')}")


if __name__ == "__main__":
    main()
