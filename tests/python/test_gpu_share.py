"""GPU test of sharing an expandable pool between processes (issue 49): 64 CuPy arrays from a
shareable pool (some across pages), attached by 3 importer processes that read them bit-exact
through ``__cuda_array_interface__`` (CuPy, and PyTorch where installed), a free by the
exporter while importers hold the array (deferred, counted, the bytes kept), then the
importers let go and the free runs. Then lifetimes with real processes: a published pool
sleeps once no importer is attached (refused while one is), refuses attaches while asleep,
wakes at the same addresses, and importers attach again to the same bytes; the exporter killed
with SIGKILL, the importer reads on, a new exporter adopts the segments within a second and a
third process reads them. Skipped with a reason where there is no CUDA driver or device, or no
CuPy."""

from __future__ import annotations

import json
import os
import random
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
        batch = rrmm.share.tensors(imp, names)
        out["torch_batch"] = {n: [hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest(),
                                  list(t.shape)] for n, t in zip(names, batch)}
        del batch
    except ImportError:
        pass
    try:
        from numba import cuda as numba_cuda
        n = numba_cuda.as_cuda_array(imp.get(names[-1]))
        out["numba"] = hashlib.sha256(n.copy_to_host().tobytes()).hexdigest()
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
        if "numba" in seen:
            assert seen["numba"] == expected[names[-1]], "Numba through the array interface"
        if "torch" in seen:
            assert seen["torch"] == expected[names[0]]
            for name in names:  # rrmm.share.tensors: views of one span, bit-exact
                assert seen["torch_batch"][name][0] == expected[name], name
                assert tuple(seen["torch_batch"][name][1]) == arrays[name].shape
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


# Lifetimes with real processes: a published pool's sleep, wake and attach again; the
# exporter killed (SIGKILL), importers reading on, a new exporter adopting the segments.

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
        # Every array, those across two pages too: the pages keep their places.
        assert segments >= 2 and adopted == len(names), (segments, adopted)
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


# The ledger beside a published pool: the exporter joins its GPU's ledger with a soft share
# below what it holds and declares itself idle; an importer joins too, maps the array, and asks
# the ledger for more than the device has free. The exporter's sleep is refused (an importer is
# attached), the ask ends within its deadlines, nothing moves, and the ledger counts the array
# once: in the exporter's row, not the importer's.

LEDGER_EXPORTER = textwrap.dedent(
    """
    import json, sys
    import cupy
    import rrmm.mr, rrmm.shared_gpu
    from rrmm.allocators.cupy import rmm_cupy_allocator

    cupy.cuda.Device(0).use()
    pool = rrmm.mr.ExpandableMemoryResource(shareable=True, page_size=32 << 20)
    rrmm.shared_gpu.join(pool, directory=sys.argv[1], name="exporter", soft_share="256MiB")
    rrmm.mr.set_current_device_resource(pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    a = cupy.arange(256 << 20, dtype=cupy.float32)  # 1 GiB
    cupy.cuda.Device().synchronize()
    pub = pool.publish("counted", directory=sys.argv[1])
    pub.share("a", a, readonly=True)
    rrmm.shared_gpu.declare_idle(pool)
    print(json.dumps({"path": pub.path}), flush=True)
    sys.stdin.readline()
    notes = [e.get("note", "") for e in rrmm.shared_gpu.history(pool)]
    print(json.dumps({"sum": float(a[:1000].sum()), "mapped": pool.mapped_bytes(),
                      "importers": pool.share_figures()["importers"], "notes": notes}),
          flush=True)
    sys.stdin.readline()
    """
)

LEDGER_IMPORTER = textwrap.dedent(
    """
    import json, sys, time
    import cupy
    import rrmm.mr, rrmm.share, rrmm.shared_gpu

    cupy.cuda.Device(0).use()
    pool = rrmm.mr.ExpandableMemoryResource()
    rrmm.shared_gpu.join(pool, directory=sys.argv[1], name="importer")
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    imp = rrmm.share.attach(sys.argv[2], timeout=30)
    a = cupy.asarray(imp.get("a"))
    total = float(a[:1000].sum())
    free_after = cupy.cuda.runtime.memGetInfo()[0]
    time.sleep(0.6)  # each member writes its entry every quarter second
    rows = {r.name: r.live for r in rrmm.shared_gpu.processes(pool)}
    t0 = time.perf_counter()
    # Short of 256 MiB: the exporter's sleep would cover it, trims cannot.
    asked = rrmm.shared_gpu.ask(free_after + (256 << 20), pool)
    ask_s = time.perf_counter() - t0
    print(json.dumps({"sum": total, "mapped_drop": free_before - free_after, "rows": rows,
                      "ask_s": ask_s, "note": asked.get("note", ""),
                      "again": float(a[:1000].sum())}), flush=True)
    sys.stdin.readline()
    """
)


def test_the_ledger_counts_a_shared_array_once_and_its_ask_cannot_sleep_a_held_pool() -> None:
    directory = tempfile.mkdtemp(prefix="rl")
    os.chmod(directory, 0o700)
    exporter = _start(LEDGER_EXPORTER, directory)
    importer = None
    try:
        path = _line(exporter)["path"]
        importer = _start(LEDGER_IMPORTER, directory, path)
        seen = _line(importer)
        want = float(sum(range(1000)))
        assert seen["sum"] == want and seen["again"] == want
        gib = 1 << 30
        assert seen["rows"]["exporter"] >= gib, seen["rows"]
        assert seen["rows"]["importer"] < 64 * MiB, "the mapped array is not the importer's"
        assert seen["mapped_drop"] < 256 * MiB, "mapping it made no second copy"
        assert seen["ask_s"] < 10, seen
        assert exporter.stdin is not None
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        after = _line(exporter)
        assert after["sum"] == want
        assert after["mapped"] >= gib, "the held pool did not sleep"
        assert after["importers"] == 1
        assert any("importers are attached" in n for n in after["notes"]), (after, seen)
        print(json.dumps({"ledger": seen, "exporter_notes": after["notes"][-3:]}))
    finally:
        for proc in (importer, exporter):
            if proc is not None:
                _end(proc)


# Read-only on the device: an importer that resolved only a read-only name maps its page
# read-only (where the driver protects it); a write there fails in that process, and the
# exporter's bytes are unchanged.

DEVICE_WRITER = textwrap.dedent(
    """
    import json, sys
    import cupy
    import rrmm.share

    cupy.cuda.Device(0).use()
    imp = rrmm.share.attach(sys.argv[1], timeout=30)
    a = imp.get(sys.argv[2])
    print(json.dumps({"read_only_segments": imp.read_only_segments}), flush=True)
    try:
        cupy.cuda.runtime.memset(a.ptr, 0x58, 4)
        cupy.cuda.runtime.deviceSynchronize()
        print(json.dumps({"wrote": True}), flush=True)
    except Exception as e:
        print(json.dumps({"wrote": False, "error": repr(e)[:300]}), flush=True)
    """
)


def test_a_read_only_weight_is_mapped_read_only_on_the_device(pool: Any) -> None:
    weights = cupy.arange(1 << 20, dtype=cupy.float32)
    scratch = cupy.zeros(1 << 10, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    before = _digest(weights)
    pub = pool.publish("ro", directory=tempfile.mkdtemp(prefix="rs"))
    pub.share("weights", weights, readonly=True)
    pub.share("scratch", scratch)
    ro = subprocess.run(
        [sys.executable, "-c", DEVICE_WRITER, pub.path, "weights"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    lines = [json.loads(x) for x in ro.stdout.splitlines() if x.startswith("{")]
    print(json.dumps({"read_only": lines, "rc": ro.returncode, "stderr": ro.stderr[-300:]}))
    assert lines, ro.stderr[-500:]
    if lines[0]["read_only_segments"] == 0:
        pytest.skip("this driver maps the page read-write (cuMemSetAccess refused PROT_READ)")
    assert len(lines) == 1 or lines[1]["wrote"] is False, lines
    assert _digest(weights) == before, "the exporter's bytes are unchanged"
    rw = subprocess.run(
        [sys.executable, "-c", DEVICE_WRITER, pub.path, "scratch"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    lines = [json.loads(x) for x in rw.stdout.splitlines() if x.startswith("{")]
    assert lines[-1].get("wrote") is True, (lines, rw.stderr[-500:])
    assert int(cupy.asnumpy(scratch.view(cupy.uint8)[0])) == 0x58
    _wait_for(pool, "importers", 0)
    pub.close()
    del weights, scratch
