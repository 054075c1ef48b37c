"""Attach time of arrays shared between processes on one GPU (issue 49): rrmm's shareable pool
beside PyTorch's per-tensor CUDA IPC, one JSON line per case.

An exporter process allocates N float32 arrays totalling G GB (sizes drawn log-uniformly, the
same for every case), fills each with values that depend on its index, and shares them; an
importer process (its CUDA context made before the clock starts) times what it takes to have
every array usable:

- ``rrmm_cupy``: a shareable ``ExpandableMemoryResource`` (CuPy allocating from it), published;
  the importer times ``rrmm.share.attach`` + ``get_many`` of every name + ``cupy.asarray`` of
  each (each page mapped once, into one range);
- ``rrmm_torch``: the same, with ``torch.as_tensor(..., device="cuda")`` of each;
- ``rrmm_torch_dlpack``: the same, with ``torch.from_dlpack`` of each (DLPack capsules over
  the mapped memory instead of ``__cuda_array_interface__`` dicts);
- ``rrmm_torch_batch``: ``rrmm.share.tensors``: one tensor over the span of every array,
  each array a view of it (``as_strided``), with its steps' seconds;
- ``cuda_core_ipc``: cuda.core's IPC-enabled ``DeviceMemoryResource`` (a stream-ordered pool
  whose allocation handle and buffer descriptors travel through ``multiprocessing`` queues of
  the spawn start method, as cuda.core requires); the importer times receiving them, mapping
  the pool (``from_allocation_handle``), rebuilding every buffer and wrapping it in CuPy;
- ``torch_ipc``: PyTorch's own allocator, each tensor reduced with
  ``torch.multiprocessing.reductions.reduce_tensor`` (CUDA IPC handles, what
  ``torch.multiprocessing`` queues send), pickled to a file; the importer times loading the
  pickle + rebuilding every tensor.

Every case then checks a sample of arrays element for element (not timed). Standard library +
CuPy + PyTorch (imported in the processes that need them; a case whose framework is missing is
reported as skipped).

Usage: python benches/gpu/share_attach.py [--gb 20] [--arrays 5000] [--big] [--cases ...]
(``--big``: 60 GB in 10,000 arrays). Runs in about a minute on one H200 (both sizes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

SEED = 49
CHECK = 64
CASES = (
    "rrmm_cupy",
    "rrmm_torch",
    "rrmm_torch_dlpack",
    "rrmm_torch_batch",
    "torch_ipc",
    "cuda_core_ipc",
)
# The value of element i of array k: exact in float32 (below 2**24), the same in every framework.
MODULUS = 1_000_003
MULT = 2_654_435_761


def sizes(total_bytes: int, count: int) -> list[int]:
    """Element counts of `count` float32 arrays, log-uniform between 4 KiB and 64x that, scaled
    to `total_bytes` in all."""
    rng = random.Random(SEED)
    raw = [math.exp(rng.uniform(0, math.log(64))) for _ in range(count)]
    scale = total_bytes / 4 / sum(raw)
    return [max(256, int(r * scale) // 256 * 256) for r in raw]


def sample(count: int) -> list[int]:
    return sorted(random.Random(SEED + 1).sample(range(count), min(CHECK, count)))


# ---- rrmm --------------------------------------------------------------------------------


def cupy_fill() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "int64 seed",
        "float32 y",
        f"y = (float)((i * {MULT}LL + seed) % {MODULUS}LL)",
        "rrmm_share_fill",
    )


def exporter_rrmm(counts: list[int], directory: str) -> None:
    import cupy
    import rrmm.mr
    from rrmm.allocators.cupy import rmm_cupy_allocator

    cupy.cuda.Device(0).use()
    pool = rrmm.mr.ExpandableMemoryResource(shareable=True)
    rrmm.mr.set_current_device_resource(pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    fill = cupy_fill()
    t0 = time.perf_counter()
    arrays = [cupy.empty(n, dtype=cupy.float32) for n in counts]
    for k, a in enumerate(arrays):
        fill(k, a)
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()
    pub = pool.publish("bench", directory=directory)
    for k, a in enumerate(arrays):
        pub.share(f"a{k}", a)
    t2 = time.perf_counter()
    print(json.dumps({"path": pub.path, "alloc_fill_s": t1 - t0, "publish_s": t2 - t1}), flush=True)
    sys.stdin.readline()
    figures = pool.share_figures() or {}
    keys = ("segments", "kept_bytes", "importers", "leases")
    print(json.dumps({k: figures.get(k) for k in keys}), flush=True)
    sys.stdin.readline()


def importer_rrmm(count: int, path: str, framework: str) -> None:
    import cupy
    import rrmm.share

    cupy.cuda.Device(0).use()
    cupy.zeros(1)
    if framework.startswith("torch"):
        import torch

        torch.zeros(1, device="cuda")
    names = [f"a{k}" for k in range(count)]
    t0 = time.perf_counter()
    imp = rrmm.share.attach(path, timeout=120)
    t1 = time.perf_counter()
    shared = imp.get_many(names)
    t2 = time.perf_counter()
    phases: dict[str, float] = {}
    if framework == "torch_batch":  # rrmm.share.tensors, the names resolved above
        arrays = rrmm.share._tensors_of(imp, shared, phases)
        torch.cuda.synchronize()
    elif framework == "torch":
        arrays = [torch.as_tensor(s, device="cuda") for s in shared]
        torch.cuda.synchronize()
    elif framework == "torch_dlpack":
        arrays = [torch.from_dlpack(s) for s in shared]
        torch.cuda.synchronize()
    else:
        arrays = [cupy.asarray(s) for s in shared]
        cupy.cuda.Device().synchronize()
    t3 = time.perf_counter()
    if framework == "torch_batch":  # what reading each array's fields costs here (a probe)
        g0 = time.perf_counter()
        fields = [(s.ptr, s.shape, s.typestr, s.host, s.nbytes) for s in shared]
        phases["fields_probe_s"] = time.perf_counter() - g0
        del fields
    fill = cupy_fill()
    bad = 0
    for k in sample(count):
        got = cupy.asarray(arrays[k])
        want = cupy.empty(got.size, dtype=cupy.float32)
        fill(k, want)
        bad += int(not bool(cupy.array_equal(got.ravel(), want)))
    print(
        json.dumps(
            {
                "attach_s": t1 - t0,
                "resolve_s": t2 - t1,
                "build_s": t3 - t2,
                "total_s": t3 - t0,
                "checked": len(sample(count)),
                "mismatched": bad,
                **phases,
            }
        ),
        flush=True,
    )


# ---- torch.multiprocessing's per-tensor CUDA IPC -------------------------------------------


def exporter_torch(counts: list[int], directory: str) -> None:
    import pickle

    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.set_device(0)
    t0 = time.perf_counter()
    tensors = []
    for k, n in enumerate(counts):
        t = torch.empty(n, dtype=torch.float32, device="cuda")
        idx = torch.arange(n, device="cuda", dtype=torch.int64)
        t.copy_(((idx * MULT + k) % MODULUS).to(torch.float32))
        tensors.append(t)
    del idx
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    path = os.path.join(directory, "handles.pickle")
    with open(path, "wb") as f:
        pickle.dump([reduce_tensor(t) for t in tensors], f)
    t2 = time.perf_counter()
    print(json.dumps({"path": path, "alloc_fill_s": t1 - t0, "publish_s": t2 - t1}), flush=True)
    sys.stdin.readline()
    print(json.dumps({}), flush=True)
    sys.stdin.readline()


def importer_torch(count: int, path: str) -> None:
    import pickle

    import torch

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        reductions = pickle.load(f)
    t1 = time.perf_counter()
    tensors = [rebuild(*args) for rebuild, args in reductions]
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    bad = 0
    for k in sample(count):
        got = tensors[k]
        idx = torch.arange(got.numel(), device="cuda", dtype=torch.int64)
        want = ((idx * MULT + k) % MODULUS).to(torch.float32)
        bad += int(not torch.equal(got, want))
    print(
        json.dumps(
            {
                "attach_s": t1 - t0,
                "resolve_s": 0.0,
                "build_s": t2 - t1,
                "total_s": t2 - t0,
                "checked": len(sample(count)),
                "mismatched": bad,
            }
        ),
        flush=True,
    )


# ---- cuda.core's IPC memory resource --------------------------------------------------------


def cuda_core() -> Any:
    try:
        import cuda.core as cc

        cc.DeviceMemoryResourceOptions  # noqa: B018 (the stable name, or the experimental one)
    except (ImportError, AttributeError):
        import cuda.core.experimental as cc
    return cc


def member(obj: Any, *names: str) -> Any:
    """The first of `names` that `obj` has: a property's value, or a method's result (the name
    changed between cuda.core's releases)."""
    for name in names:
        if hasattr(obj, name):
            value = getattr(obj, name)
            return value() if callable(value) else value
    raise AttributeError(f"{type(obj).__name__} has none of {names}")


def exporter_cuda_core(counts: list[int], out: Any, go: Any) -> None:
    import cupy

    cc = cuda_core()
    dev = cc.Device(0)
    dev.set_current()
    total = sum(counts) * 4
    options = cc.DeviceMemoryResourceOptions(ipc_enabled=True, max_size=total + (1 << 30))
    mr = cc.DeviceMemoryResource(dev, options=options)
    stream = dev.create_stream()
    fill = cupy_fill()
    t0 = time.perf_counter()
    buffers = [mr.allocate(n * 4, stream=stream) for n in counts]
    stream.sync()
    for k, (b, n) in enumerate(zip(buffers, counts)):
        mem = cupy.cuda.UnownedMemory(int(b.handle), n * 4, b)
        fill(k, cupy.ndarray((n,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0)))
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()
    handle = member(mr, "allocation_handle", "get_allocation_handle")
    descriptors = [member(b, "ipc_descriptor", "get_ipc_descriptor") for b in buffers]
    t2 = time.perf_counter()
    out.put({"alloc_fill_s": t1 - t0, "publish_s": t2 - t1})
    out.put((handle, descriptors))
    go.get()


def importer_cuda_core(counts: list[int], inbox: Any, ready: Any, out: Any) -> None:
    import cupy

    cc = cuda_core()
    dev = cc.Device(0)
    dev.set_current()
    cupy.cuda.Device(0).use()
    cupy.zeros(1)
    ready.get()
    t0 = time.perf_counter()
    handle, descriptors = inbox.get()
    t1 = time.perf_counter()
    mr = cc.DeviceMemoryResource.from_allocation_handle(dev, handle)
    stream = dev.create_stream()
    buffers = [cc.Buffer.from_ipc_descriptor(mr, d, stream=stream) for d in descriptors]
    t2 = time.perf_counter()
    arrays = [
        cupy.ndarray(
            (n,),
            cupy.float32,
            cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(int(b.handle), n * 4, b), 0),
        )
        for b, n in zip(buffers, counts)
    ]
    cupy.cuda.Device().synchronize()
    t3 = time.perf_counter()
    fill = cupy_fill()
    bad = 0
    for k in sample(len(counts)):
        want = cupy.empty(arrays[k].size, dtype=cupy.float32)
        fill(k, want)
        bad += int(not bool(cupy.array_equal(arrays[k], want)))
    out.put(
        {
            "attach_s": t1 - t0,
            "resolve_s": t2 - t1,
            "build_s": t3 - t2,
            "total_s": t3 - t0,
            "checked": len(sample(len(counts))),
            "mismatched": bad,
        }
    )


def run_cuda_core(gb: float, count: int) -> dict[str, Any]:
    import multiprocessing

    record: dict[str, Any] = {"case": "cuda_core_ipc", "gb": gb, "arrays": count}
    try:
        cuda_core()
    except ImportError as e:
        return {**record, "skipped": f"cuda.core is not installed ({e})"}
    counts = sizes(int(gb * 1e9), count)
    ctx = multiprocessing.get_context("spawn")
    handles, ready, go, out = (ctx.Queue() for _ in range(4))
    exporter = ctx.Process(target=exporter_cuda_core, args=(counts, handles, go))
    importer = ctx.Process(target=importer_cuda_core, args=(counts, handles, ready, out))
    exporter.start()
    importer_started = False
    try:
        made = handles.get(timeout=150)
        importer.start()
        importer_started = True
        ready.put(True)
        timed = out.get(timeout=150)
        go.put(True)
    finally:
        for p in (importer, exporter) if importer_started else (exporter,):
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return {
        **record,
        **timed,
        "exporter_alloc_fill_s": made["alloc_fill_s"],
        "exporter_publish_s": made["publish_s"],
    }


# ---- the driver --------------------------------------------------------------------------


def missing(case: str) -> str | None:
    """Why `case` cannot run here, or None."""
    needs = {
        "rrmm_cupy": ["cupy"],
        "rrmm_torch": ["cupy", "torch"],
        "rrmm_torch_dlpack": ["cupy", "torch"],
        "rrmm_torch_batch": ["cupy", "torch"],
        "torch_ipc": ["torch"],
    }
    for module in needs[case]:
        try:
            __import__(module)
        except ImportError as e:
            return f"{module} is not installed ({e})"
    return None


def child(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", role, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def line_of(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The next JSON line `proc` prints, within `timeout` seconds."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        proc.kill()
        raise TimeoutError(f"no answer in {timeout} s from {proc.args}")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args} ended (status {proc.wait()})")
    return dict(json.loads(line))


def run_case(case: str, gb: float, count: int) -> dict[str, Any]:
    if case == "cuda_core_ipc":
        return run_cuda_core(gb, count)
    record: dict[str, Any] = {"case": case, "gb": gb, "arrays": count}
    why = missing(case)
    if why is not None:
        return {**record, "skipped": why}
    directory = tempfile.mkdtemp(prefix="rs")
    kind = "torch" if case == "torch_ipc" else "rrmm"
    common = ["--gb", str(gb), "--arrays", str(count), "--dir", directory]
    exporter = child(f"exporter-{kind}", *common)
    try:
        ready = line_of(exporter, 150)
        framework = {
            "rrmm_torch": "torch",
            "rrmm_torch_dlpack": "torch_dlpack",
            "rrmm_torch_batch": "torch_batch",
        }.get(case, "cupy")
        importer = child(f"importer-{kind}", *common, "--path", ready["path"], "--fw", framework)
        timed = line_of(importer, 150)
        assert exporter.stdin is not None
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        figures = line_of(exporter, 30)
        importer.communicate(timeout=60)
        exporter.communicate("\n", timeout=60)
    finally:
        for p in (exporter,):
            if p.poll() is None:
                p.kill()
    return {
        **record,
        **timed,
        "exporter_alloc_fill_s": ready["alloc_fill_s"],
        "exporter_publish_s": ready["publish_s"],
        **{f"exporter_{k}": v for k, v in figures.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=20.0)
    ap.add_argument("--arrays", type=int, default=5000)
    ap.add_argument("--big", action="store_true", help="60 GB in 10,000 arrays")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fw", default="cupy", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.big:
        args.gb, args.arrays = 60.0, 10_000
    counts = sizes(int(args.gb * 1e9), args.arrays)
    if args.role == "exporter-rrmm":
        return exporter_rrmm(counts, args.dir)
    if args.role == "exporter-torch":
        return exporter_torch(counts, args.dir)
    if args.role == "importer-rrmm":
        return importer_rrmm(len(counts), args.path, args.fw)
    if args.role == "importer-torch":
        return importer_torch(len(counts), args.path)
    for case in args.cases.split(","):
        try:
            print(json.dumps(run_case(case, args.gb, args.arrays)), flush=True)
        except Exception as e:  # noqa: BLE001 (a case that fails is a row, not the end)
            print(json.dumps({"case": case, "error": repr(e)}), flush=True)


if __name__ == "__main__":
    main()
