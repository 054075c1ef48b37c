"""GPU tests of a shared pool's lifetimes (issue 49), with real processes on one device:

- a published pool sleeps once no importer is attached (refused while one is), refuses attaches
  while asleep, wakes at the same addresses, and importers attach again to the same names and
  read the same bytes;
- the exporter killed with SIGKILL: the importer reads on from what it maps; a new exporter
  adopts the segments from it within a second, copying nothing, and a third process attaches
  to the new exporter and reads the same bytes.

Skipped with a reason where there is no CUDA driver or device, or no CuPy."""

from __future__ import annotations

import hashlib
import json
import os
import signal
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

# Reads every name at a path; prints {name: sha256} once, then waits for a line to end.
READER = textwrap.dedent(
    """
    import hashlib, json, sys
    import cupy
    import rrmm.share

    cupy.cuda.Device(0).use()
    imp = rrmm.share.attach(sys.argv[1], timeout=30)
    names = sorted(imp.names())
    arrays = [cupy.asarray(s) for s in imp.get_many(names)]
    print(json.dumps({n: hashlib.sha256(cupy.asnumpy(a).tobytes()).hexdigest()
                      for n, a in zip(names, arrays)}), flush=True)
    sys.stdin.readline()
    """
)

# A shareable pool with 16 CuPy arrays of 4 MiB named a0..a15; prints its path and the
# digests, then waits (to be killed).
EXPORTER = textwrap.dedent(
    """
    import hashlib, json, sys
    import cupy
    import rrmm.mr
    from rrmm.allocators.cupy import rmm_cupy_allocator

    cupy.cuda.Device(0).use()
    pool = rrmm.mr.ExpandableMemoryResource(shareable=True, page_size=32 << 20)
    rrmm.mr.set_current_device_resource(pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    rng = cupy.random.default_rng(7)
    arrays = {f"a{i}": rng.standard_normal(1 << 20, dtype=cupy.float32) for i in range(16)}
    cupy.cuda.Device().synchronize()
    pub = pool.publish("dying", directory=sys.argv[1])
    for n, a in arrays.items():
        pub.share(n, a)
    print(json.dumps({"path": pub.path, "digests": {
        n: hashlib.sha256(cupy.asnumpy(a).tobytes()).hexdigest() for n, a in arrays.items()}}),
        flush=True)
    sys.stdin.readline()
    """
)

# An exporter that takes segments back from importers: prints its path, then (after a line)
# its names.
ADOPTER = textwrap.dedent(
    """
    import json, sys
    import rrmm.share

    exp = rrmm.share.publish("adopter", directory=sys.argv[1], accept_adoption=True)
    print(json.dumps({"path": exp.path}), flush=True)
    sys.stdin.readline()
    print(json.dumps(exp.names()), flush=True)
    sys.stdin.readline()
    """
)


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen[str]) -> Any:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the process ended early (exit {proc.poll()})"
    return json.loads(line)


def _end(proc: subprocess.Popen[str]) -> None:
    try:
        proc.communicate("\n\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def _digest(a: Any) -> str:
    return hashlib.sha256(cupy.asnumpy(a).tobytes()).hexdigest()


@pytest.fixture
def pool() -> Any:
    from rrmm.allocators.cupy import rmm_cupy_allocator

    before = mr.get_current_device_resource()
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


def test_a_published_pool_sleeps_wakes_and_importers_attach_again(pool: Any) -> None:
    rng = cupy.random.default_rng(49)
    arrays = {f"s{i}": rng.standard_normal((i + 1) * 3 * MiB, dtype=cupy.float32) for i in range(8)}
    cupy.cuda.Device().synchronize()
    pub = pool.publish("sleepy", directory=tempfile.mkdtemp(prefix="rs"))
    for name, a in arrays.items():
        pub.share(name, a)
    expected = {n: _digest(a) for n, a in arrays.items()}
    ptrs = {n: a.data.ptr for n, a in arrays.items()}
    reader = _start(READER, pub.path)
    assert _line(reader) == expected
    with pytest.raises(RuntimeError, match="importers are attached"):
        pool.offload()
    _end(reader)
    _wait_for(pool, "importers", 0)
    t0 = time.perf_counter()
    slept = pool.offload()
    offload_s = time.perf_counter() - t0
    assert pool.mapped_bytes() == 0, "asleep: no device page left"
    late = subprocess.run(
        [sys.executable, "-c", READER, pub.path],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert late.returncode != 0 and "sleeps" in late.stderr, late.stderr[-500:]
    t0 = time.perf_counter()
    pool.restore()
    restore_s = time.perf_counter() - t0
    assert {n: a.data.ptr for n, a in arrays.items()} == ptrs, "same addresses"
    assert {n: _digest(a) for n, a in arrays.items()} == expected
    reader = _start(READER, pub.path)
    assert _line(reader) == expected, "the same names, the same bytes, the new pages"
    _end(reader)
    print(
        json.dumps(
            {
                "sleep_bytes": sum(a.nbytes for a in arrays.values()),
                "copied_bytes": slept["copied_bytes"],
                "offload_s": offload_s,
                "restore_s": restore_s,
            }
        )
    )
    _wait_for(pool, "importers", 0)
    arrays.clear()
    del rng
    pub.close()


def test_the_exporter_killed_importers_read_on_and_a_new_exporter_adopts() -> None:
    directory = tempfile.mkdtemp(prefix="rs")
    exporter = _start(EXPORTER, directory)
    adopter = None
    third = None
    try:
        first = _line(exporter)
        import rrmm.share

        cupy.cuda.Device(0).use()
        imp = rrmm.share.attach(first["path"], timeout=30)
        names = sorted(first["digests"])
        arrays = [cupy.asarray(s) for s in imp.get_many(names)]
        assert {n: _digest(a) for n, a in zip(names, arrays)} == first["digests"]
        os.kill(exporter.pid, signal.SIGKILL)
        exporter.wait(timeout=30)
        with pytest.raises((OSError, RuntimeError)):
            imp.names()  # the exporter's socket is closed
        assert imp.exporter_gone
        assert {n: _digest(a) for n, a in zip(names, arrays)} == first["digests"], (
            "what the importer maps outlives the exporter"
        )
        adopter = _start(ADOPTER, directory)
        path = _line(adopter)["path"]
        t0 = time.perf_counter()
        segments, adopted = imp.hand_back(path)
        adopt_s = time.perf_counter() - t0
        assert adopt_s < 1.0, adopt_s
        assert segments >= 1 and adopted >= 12, (segments, adopted)  # arrays on one page each
        assert adopter.stdin is not None
        adopter.stdin.write("\n")
        adopter.stdin.flush()
        kept = _line(adopter)
        assert len(kept) == adopted
        third = _start(READER, path)
        seen = _line(third)
        assert set(seen) == set(kept)
        for name in kept:
            assert seen[name] == first["digests"][name], name
        print(json.dumps({"adopt_s": adopt_s, "segments": segments, "names": adopted}))
        imp.close()
    finally:
        for proc in (exporter, adopter, third):
            if proc is not None:
                if proc.poll() is None and proc is not exporter:
                    _end(proc)
                elif proc.poll() is None:
                    proc.kill()
