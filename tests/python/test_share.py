"""rrmm.share across two real processes, on memory files (the CPU stand-in for device memory):
bytes written by the exporter read bit-exact by an importer, names rebuilt as arrays through
``__array_interface__``, and a free that waits for the importer that holds the name; then a
shareable expandable pool on host memory published as a whole (arrays across pages, a free
that waits, a trim and a sleep that keep exported pages, refusals)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rrmm.share
from hypothesis import given, settings
from hypothesis import strategies as st

IMPORTER = textwrap.dedent(
    """
    import hashlib, sys
    import numpy as np
    import rrmm.share

    directory, name = sys.argv[1], sys.argv[2]
    imp = rrmm.share.attach("exp", directory=directory)
    face = imp.resolve(name)

    class View:
        __array_interface__ = {
            "shape": face["shape"], "typestr": face["typestr"], "data": face["data"],
            "version": 3,
        }

    array = np.asarray(View())
    print("HASH", hashlib.sha256(array.tobytes()).hexdigest(), flush=True)
    print("SAME", imp.read(name) == array.tobytes(), flush=True)
    print("READONLY", face["data"][1], not array.flags.writeable, flush=True)
    print("NAMES", ",".join(imp.names()), flush=True)
    print("HELD", flush=True)
    sys.stdin.readline()
    """
)


def _importer(directory: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", IMPORTER, str(directory), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _lines_until(proc: subprocess.Popen[str], word: str) -> dict[str, str]:
    assert proc.stdout is not None
    seen: dict[str, str] = {}
    for line in proc.stdout:
        key, _, rest = line.strip().partition(" ")
        seen[key] = rest
        if key == word:
            return seen
    raise AssertionError(f"the importer ended before {word}: {seen}")


def _wait_for(exp: rrmm.share.Exporter, key: str, value: int) -> None:
    deadline = time.monotonic() + 10
    while exp.figures()[key] != value:
        assert time.monotonic() < deadline, exp.figures()
        time.sleep(0.01)


@pytest.fixture
def exporter(tmp_path: Path) -> rrmm.share.Exporter:
    exp = rrmm.share.publish("exp", directory=tmp_path)
    yield exp
    exp.close()


def test_an_importer_process_reads_the_exporters_array_bit_exact(
    exporter: rrmm.share.Exporter, tmp_path: Path
) -> None:
    weights = np.random.default_rng(7).standard_normal(100_000).astype("<f4")
    seg = exporter.add_segment(1 << 20)
    exporter.write(seg, 4096, weights.tobytes())
    exporter.publish("w", seg, 4096, weights.nbytes, "<f4", weights.shape, readonly=True)
    exporter.publish("other", seg, 0, 16)
    proc = _importer(tmp_path, "w")
    seen = _lines_until(proc, "HELD")
    assert seen["HASH"] == hashlib.sha256(weights.tobytes()).hexdigest()
    assert seen["SAME"] == "True"
    assert seen["READONLY"] == "True True"
    assert seen["NAMES"] == "other,w"
    assert exporter.figures()["leases"] == 1
    proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    _wait_for(exporter, "leases", 0)


def test_a_free_waits_for_the_importer_process_that_holds_the_name(
    exporter: rrmm.share.Exporter, tmp_path: Path
) -> None:
    seg = exporter.add_segment(1 << 16)
    exporter.write(seg, 0, b"shared")
    exporter.publish("a", seg, 0, 6)
    proc = _importer(tmp_path, "a")
    _lines_until(proc, "HELD")
    assert exporter.free("a") is False, "held by the importer: the free waits"
    assert exporter.figures()["deferred_frees"] == 1
    assert exporter.names() == []
    proc.communicate("\n", timeout=30)
    _wait_for(exporter, "deferred_frees", 0)
    assert exporter.figures()["frees_after_wait"] == 1


def test_names_errors_and_adoption_in_one_process(tmp_path: Path) -> None:
    exp = rrmm.share.publish("old", directory=tmp_path)
    seg = exp.add_segment(1 << 16)
    exp.write(seg, 0, b"kept")
    exp.publish("k", seg, 0, 4)
    with pytest.raises(ValueError, match="exported already"):
        exp.publish("k", seg, 0, 4)
    with pytest.raises(ValueError, match="pass segment"):
        exp.publish("far", seg, 1 << 16, 4)
    imp = rrmm.share.attach("old", directory=tmp_path)
    with pytest.raises(KeyError):
        imp.resolve("missing")
    assert imp.read("k") == b"kept"
    exp.close()
    assert imp.read("k") == b"kept", "the exporter is gone; the map is not"
    new = rrmm.share.publish("new", directory=tmp_path, accept_adoption=True)
    assert imp.hand_back(new.path) == (1, 1)
    assert new.names() == ["k"]
    other = rrmm.share.attach(path=new.path)
    assert other.read("k") == b"kept"
    with pytest.raises(TypeError):
        rrmm.share.attach()
    imp.close()
    other.close()
    new.close()


# A shareable expandable pool on host memory (a memory file per page: the CPU stand-in for a
# device's shareable pages), published as a whole.

POOL_IMPORTER = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np
    import rrmm.share

    imp = rrmm.share.attach(sys.argv[1])
    names = sys.argv[2].split(",")
    arrays = [np.asarray(a) for a in imp.get_many(names)]
    print(json.dumps({n: [hashlib.sha256(a.tobytes()).hexdigest(), str(a.dtype), list(a.shape),
                          bool(a.flags.writeable)] for n, a in zip(names, arrays)}), flush=True)
    sys.stdin.readline()  # the exporter freed one: read it again
    print(hashlib.sha256(arrays[0].tobytes()).hexdigest(), flush=True)
    sys.stdin.readline()
    """
)

PAGE = 2 << 20


def _host_pool(**kwargs: object) -> rrmm.mr.ExpandableMemoryResource:
    return rrmm.mr.ExpandableMemoryResource(
        pageable_host=True,
        device_capacity=256 << 20,
        reserve_size=256 << 20,
        page_size=PAGE,
        **kwargs,  # type: ignore[arg-type]
    )


def _pool_array(
    pool: rrmm.mr.ExpandableMemoryResource, values: np.ndarray
) -> tuple[Any, np.ndarray]:
    """A DeviceBuffer of the (host) pool holding ``values``, and a NumPy view of it."""
    import ctypes

    buf = rrmm.DeviceBuffer(size=values.nbytes, mr=pool)
    view = np.ctypeslib.as_array((ctypes.c_uint8 * values.nbytes).from_address(buf.ptr))
    view[:] = values.view(np.uint8).reshape(-1)
    return buf, view.view(values.dtype).reshape(values.shape)


def test_a_shareable_pool_serves_its_arrays_to_another_process_bit_exact(tmp_path: Path) -> None:
    pool = _host_pool(shareable=True)
    assert pool.shareable
    directory = tempfile.mkdtemp(prefix="rs")
    pub = pool.publish("pool", directory=directory)
    rng = np.random.default_rng(11)
    arrays = {
        "small": rng.standard_normal(1000).astype("<f4"),
        # Across three pages: the importer maps them side by side.
        "across": rng.integers(0, 2**31, size=(3, PAGE // 4 + 77), dtype="<i4"),
        "bytes": rng.integers(0, 255, size=PAGE + 1, dtype="u1"),
    }
    kept = {}
    for name, values in arrays.items():
        buf, view = _pool_array(pool, values)
        kept[name] = buf
        pub.share(name, view, readonly=name == "small")
    del buf, view
    assert sorted(pub.names()) == sorted(arrays)
    proc = subprocess.Popen(
        [sys.executable, "-c", POOL_IMPORTER, pub.path, ",".join(arrays)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    seen = json.loads(proc.stdout.readline())
    for name, values in arrays.items():
        digest, dtype, shape, writeable = seen[name]
        assert digest == hashlib.sha256(values.tobytes()).hexdigest(), name
        assert (dtype, tuple(shape)) == (str(values.dtype), values.shape)
        assert writeable == (name != "small")
    # The exporter frees an array the importer holds: the free waits, and is counted.
    first = next(iter(arrays))
    del kept[first]
    figures = pool.share_figures()
    assert figures is not None
    assert figures["deferred_free_blocks"] == 1
    assert figures["deferred_free_bytes"] == arrays[first].nbytes
    assert first not in pub.names()
    # Neither a new block nor a trim touches it.
    filler = [rrmm.DeviceBuffer(size=1 << 20, mr=pool) for _ in range(8)]
    pool.trim(0)
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == hashlib.sha256(arrays[first].tobytes()).hexdigest()
    with pytest.raises(RuntimeError, match="exported"):
        pool.offload()
    proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    _wait_for_pool(pool, "deferred_free_blocks", 0)
    assert pool.share_figures()["frees_after_wait"] == 1  # type: ignore[index]
    del filler
    pub.close()
    kept.clear()
    pool.trim(0)
    assert pool.mapped_bytes() == 0


def _wait_for_pool(pool: rrmm.mr.ExpandableMemoryResource, key: str, value: int) -> None:
    deadline = time.monotonic() + 10
    while (pool.share_figures() or {}).get(key) != value:
        assert time.monotonic() < deadline, pool.share_figures()
        time.sleep(0.01)


def test_a_pool_that_cannot_share_says_why() -> None:
    with pytest.raises(ValueError, match="spill"):
        _host_pool(shareable=True, spill_to_host=64 << 20)
    with pytest.raises(ValueError, match="no bytes"):
        rrmm.mr.ExpandableMemoryResource(simulated_capacity=1 << 30, shareable=True)
    plain = _host_pool()
    assert not plain.shareable and plain.share_figures() is None
    with pytest.raises(ValueError, match="shareable=True"):
        plain.publish("x", directory=tempfile.mkdtemp(prefix="rs"))


def test_a_name_lies_in_a_live_block_and_is_contiguous() -> None:
    pool = _host_pool(shareable=True)
    pub = pool.publish("names", directory=tempfile.mkdtemp(prefix="rs"))
    buf, view = _pool_array(pool, np.arange(64, dtype="<f8").reshape(8, 8))
    with pytest.raises(ValueError, match="C-contiguous"):
        pub.share("t", view.T)
    with pytest.raises(ValueError, match="no live block"):
        pub.share("outside", buf.ptr + (1 << 40), nbytes=8)
    with pytest.raises(ValueError, match="from there"):
        pub.share("past", buf.ptr + 8, nbytes=buf.size)
    pub.share("mid", view[1:])
    with pytest.raises(ValueError, match="nbytes"):
        pub.share("p", buf.ptr)
    pub.share("p", buf.ptr, nbytes=64)
    pub.share("whole", buf)
    with pytest.raises(ValueError, match="exported already"):
        pub.share("whole", buf)
    imp = rrmm.share.attach(pub.path)
    assert np.asarray(imp.get("whole")).tobytes() == view.tobytes()
    assert imp.get("p").nbytes == 64
    mid = imp.get("mid")
    assert mid.shape == (7, 8) and np.asarray(mid).tobytes() == view[1:].tobytes()
    imp.close()
    pub.close()


# Attaches, resolves one name, says how many segments it maps read-only, then writes a byte
# at the name's address (the write faults where the page is read-only).
WRITER = textwrap.dedent(
    """
    import ctypes, sys
    import rrmm.share

    imp = rrmm.share.attach(sys.argv[1])
    a = imp.get(sys.argv[2])
    print(imp.read_only_segments, a.readonly, flush=True)
    ctypes.memset(a.ptr, 0x58, 1)
    print("WROTE", flush=True)
    """
)


def test_a_read_only_name_is_mapped_read_only_a_write_faults_and_changes_nothing() -> None:
    pool = _host_pool(shareable=True)
    pub = pool.publish("ro", directory=tempfile.mkdtemp(prefix="rs"))
    weights, view = _pool_array(pool, np.arange(1024, dtype="<f4"))
    scratch, _ = _pool_array(pool, np.zeros(16, dtype="<f4"))
    pub.share("weights", view, readonly=True)
    pub.share("scratch", scratch)
    before = view.tobytes()

    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", WRITER, pub.path, name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    faulted = run("weights")
    assert faulted.stdout.split()[:2] == ["1", "True"], faulted.stdout
    assert faulted.returncode == -signal.SIGSEGV, (faulted.returncode, faulted.stderr[-300:])
    assert "WROTE" not in faulted.stdout
    assert view.tobytes() == before, "the exporter's bytes are unchanged"
    wrote = run("scratch")
    assert wrote.returncode == 0 and "WROTE" in wrote.stdout, wrote.stderr[-300:]
    assert wrote.stdout.split()[:2] == ["0", "False"], "a writable name: the page is writable"
    _wait_for_pool(pool, "importers", 0)
    pub.close()
    del weights, scratch


# A host pool with an array across three pages and one on a page; prints its path and digests,
# then waits (to be killed).
POOL_EXPORTER = textwrap.dedent(
    """
    import ctypes, hashlib, json, sys
    import numpy as np
    import rrmm, rrmm.mr

    pool = rrmm.mr.ExpandableMemoryResource(pageable_host=True, device_capacity=64 << 20,
                                            reserve_size=64 << 20, page_size=2 << 20,
                                            shareable=True)
    pub = pool.publish("dying", directory=sys.argv[1])
    kept, digests = [], {}
    for name, nbytes in (("small", 1000), ("across", 3 * (2 << 20) + 123)):
        buf = rrmm.DeviceBuffer(size=nbytes, mr=pool)
        data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
        ctypes.memmove(buf.ptr, data.ctypes.data, nbytes)
        pub.share(name, buf.ptr, nbytes=nbytes, readonly=name == "across")
        kept.append(buf)
        digests[name] = hashlib.sha256(data.tobytes()).hexdigest()
    print(json.dumps({"path": pub.path, "digests": digests}), flush=True)
    sys.stdin.readline()
    """
)


def test_a_killed_pools_arrays_across_pages_are_adopted_and_read_bit_exact() -> None:
    directory = tempfile.mkdtemp(prefix="rs")
    proc = subprocess.Popen(
        [sys.executable, "-c", POOL_EXPORTER, directory],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        imp = rrmm.share.attach(first["path"])
        names = sorted(first["digests"])

        def digests(att: rrmm.share.Attachment) -> dict[str, str]:
            return {
                n: hashlib.sha256(np.asarray(a).tobytes()).hexdigest()
                for n, a in zip(names, att.get_many(names))
            }

        assert digests(imp) == first["digests"]
        proc.kill()  # SIGKILL
        proc.wait(timeout=30)
        assert digests(imp) == first["digests"], "the maps outlive the exporter"
        adopter = rrmm.share.publish("adopter", directory=directory, accept_adoption=True)
        segments, adopted = imp.hand_back(adopter.path)
        assert segments >= 4 and adopted == 2, "every page ('across' lies on 4), both names"
        other = rrmm.share.attach(adopter.path)
        assert digests(other) == first["digests"], "contiguous across pages in a new importer"
        across = other.get("across")
        assert across.readonly and not np.asarray(across).flags.writeable
        other.close()
        imp.close()
        adopter.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def test_attaching_where_no_exporter_serves_names_the_path_and_the_fix() -> None:
    directory = tempfile.mkdtemp(prefix="rs")
    with pytest.raises(FileNotFoundError, match=r"no exporter is serving at .*nobody.*publish"):
        rrmm.share.attach("nobody", directory=directory)
    # A socket an exporter left when it ended without closing (killed, or its interpreter
    # exited with the exporter still referenced): the same, saying so.
    import socket

    stale = rrmm.share.publish("stale", directory=directory)
    path = stale.path
    stale.close()
    left = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left.bind(path)
    left.close()
    with pytest.raises(FileNotFoundError, match=r"stale.*a socket is there, but the exporter"):
        rrmm.share.attach("stale", directory=directory)
    again = rrmm.share.publish("stale", directory=directory)  # takes the path over
    rrmm.share.attach("stale", directory=directory).close()
    again.close()


@settings(max_examples=30, deadline=None)
@given(
    dtype=st.sampled_from(["<f4", "<f8", "<i2", "|u1", "<c16", "|b1", "<i8", "<f2"]),
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=3),
)
def test_dlpack_hands_the_shared_memory_itself_to_numpy(dtype: str, shape: list[int]) -> None:
    pool = _host_pool(shareable=True)
    pub = pool.publish("dl", directory=tempfile.mkdtemp(prefix="rs"))
    rng = np.random.default_rng(sum(shape) + len(dtype))
    values = rng.integers(0, 255, size=max(1, int(np.prod(shape))) * np.dtype(dtype).itemsize,
                          dtype=np.uint8)
    values = values[: int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
    buf, view = _pool_array(pool, np.ascontiguousarray(values)) if values.nbytes else (None, None)
    imp = rrmm.share.attach(pub.path)
    try:
        if buf is None:
            return  # an empty array names no block
        pub.share("w", buf.ptr, nbytes=values.nbytes, dtype=dtype, shape=tuple(shape))
        pub.share("r", buf.ptr, nbytes=values.nbytes, dtype=dtype, shape=tuple(shape),
                  readonly=True)
        shared = imp.get("w")
        assert shared.__dlpack_device__() == (1, 0)
        got = np.from_dlpack(shared)
        assert got.dtype == np.dtype(dtype) and got.shape == tuple(shape)
        assert got.tobytes() == values.tobytes()
        assert got.__array_interface__["data"][0] == shared.ptr, "the memory itself, no copy"
        del shared  # the tensor keeps the mapping
        view.reshape(-1).view(np.uint8)[:1] ^= 0xFF
        assert got.reshape(-1).view(np.uint8)[0] == view.reshape(-1).view(np.uint8)[0]
        with pytest.raises(BufferError, match="read-only"):
            imp.get("r").__dlpack__()
        with pytest.raises(BufferError, match="copy"):
            imp.get("w").__dlpack__(copy=True)
        with pytest.raises(BufferError, match="dl_device"):
            imp.get("w").__dlpack__(dl_device=(2, 0))
        again = imp.get("w")
        before = sys.getrefcount(again)
        tensor = np.from_dlpack(again)
        assert sys.getrefcount(again) == before + 1, "the tensor holds its owner"
        del tensor
        assert sys.getrefcount(again) == before, "the consumer's deleter lets it go"
        capsule = again.__dlpack__()
        del capsule  # never consumed: its destructor frees the tensor
        assert sys.getrefcount(again) == before
        del got
    finally:
        imp.close()
        pub.close()
