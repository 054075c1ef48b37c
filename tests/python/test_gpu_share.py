"""GPU test of sharing an expandable pool between processes (issue 49): 64 CuPy arrays from a
shareable pool (some across pages), attached by 3 importer processes that read them bit-exact
through ``__cuda_array_interface__`` (CuPy, and PyTorch where installed), a free by the
exporter while importers hold the array (deferred, counted, the bytes kept), then the
importers let go and the free runs. Skipped with a reason where there is no CUDA driver or
device, or no CuPy."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import pytest
from conftest import skip_module_without_gpu
from rrmm import mr

skip_module_without_gpu()

cupy = pytest.importorskip("cupy")

MiB = 1 << 20
PAGE = 32 * MiB
IMPORTERS = 3

IMPORTER = textwrap.dedent(
    """
    import hashlib, json, sys
    import cupy
    import rrmm.share

    path, names = sys.argv[1], sys.argv[2].split(",")
    cupy.cuda.Device(0).use()

    def digest(a):
        return hashlib.sha256(cupy.asnumpy(a).tobytes()).hexdigest()

    imp = rrmm.share.attach(path, timeout=30)
    arrays = [cupy.asarray(s) for s in imp.get_many(names)]
    out = {n: [digest(a), str(a.dtype), list(a.shape)] for n, a in zip(names, arrays)}
    try:
        import torch
        t = torch.as_tensor(imp.get(names[0]), device="cuda")
        out["torch"] = hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()
    except ImportError:
        pass
    print(json.dumps(out), flush=True)
    sys.stdin.readline()  # the exporter freed names[0] meanwhile: read it again
    print(digest(arrays[0]), flush=True)
    sys.stdin.readline()
    imp.release([names[0]])
    print("released", flush=True)
    sys.stdin.readline()
    """
)


def _digest(a: Any) -> str:
    import hashlib

    return hashlib.sha256(cupy.asnumpy(a).tobytes()).hexdigest()


@pytest.fixture
def pool() -> Any:
    from rrmm.allocators.cupy import rmm_cupy_allocator

    before = mr.get_current_device_resource()
    # Restored after: CuPy's own pool (the other GPU tests' kernels keep their temporaries
    # there; `set_allocator(None)` would leave CuPy without one).
    allocator_before = cupy.cuda.get_allocator()
    pool = mr.ExpandableMemoryResource(shareable=True, page_size=PAGE)
    mr.set_current_device_resource(pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    yield pool
    cupy.cuda.set_allocator(allocator_before)
    mr.set_current_device_resource(before)


def _wait_for(pool: Any, key: str, value: int) -> None:
    deadline = time.monotonic() + 30
    while pool.share_figures()[key] != value:
        assert time.monotonic() < deadline, pool.share_figures()
        time.sleep(0.01)


def test_three_importers_read_64_arrays_bit_exact_and_a_free_waits_for_them(pool: Any) -> None:
    rng = cupy.random.default_rng(49)
    sizes = random.Random(49)
    arrays = {}
    for i in range(64):
        # Sizes from a few KiB to past two pages (an array across pages).
        n = sizes.randrange(1_000, 5 * MiB) if i % 16 else 2 * PAGE // 4 + 12_345
        arrays[f"a{i}"] = rng.standard_normal(n, dtype=cupy.float32)
    arrays["a1"] = arrays["a1"][: 4096 * 3].reshape(3, 4096)
    cupy.cuda.Device().synchronize()
    pub = pool.publish("gpu", directory=tempfile.mkdtemp(prefix="rs"))
    for name, a in arrays.items():
        pub.share(name, a)
    del a
    expected = {n: _digest(a) for n, a in arrays.items()}
    names = list(arrays)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", IMPORTER, pub.path, ",".join(names)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(IMPORTERS)
    ]
    for proc in procs:
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline())
        for name in names:
            assert seen[name][0] == expected[name], name
            assert tuple(seen[name][2]) == arrays[name].shape
        if "torch" in seen:
            assert seen["torch"] == expected[names[0]]
    figures = pool.share_figures()
    assert figures["importers"] == IMPORTERS
    assert figures["leases"] == IMPORTERS * len(names)
    # The exporter frees an array every importer holds: deferred, counted, bytes kept.
    first = arrays.pop(names[0])
    nbytes = first.nbytes
    del first
    cupy.cuda.Device().synchronize()
    figures = pool.share_figures()
    assert figures["deferred_free_blocks"] == 1
    assert figures["deferred_free_bytes"] >= nbytes
    # New arrays do not reuse it; a trim keeps its pages.
    filler = [cupy.ones(nbytes // 4, dtype=cupy.float32) for _ in range(4)]
    pool.trim(0)
    for proc in procs:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == expected[names[0]]
    with pytest.raises(RuntimeError, match="exported"):
        pool.offload()
    # The importers let go: the last release runs the free.
    for i, proc in enumerate(procs):
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        if i < IMPORTERS - 1:
            assert pool.share_figures()["deferred_free_blocks"] == 1
    _wait_for(pool, "deferred_free_blocks", 0)
    assert pool.share_figures()["frees_after_wait"] == 1
    for proc in procs:
        proc.communicate("\n", timeout=60)
        assert proc.returncode == 0
    _wait_for(pool, "importers", 0)
    del filler
    arrays.clear()
    del rng  # its generator's state lives in the pool too
    pub.close()
    cupy.cuda.Device().synchronize()
    pool.trim(0)
    assert pool.mapped_bytes() == 0
