"""Dask's arrays handed between workers of one device by attaching (``RRMMSetup(share_arrays=
True)``, ``rrmm._dask_share``), on host pools (a memory file per page: the CPU stand-in for a
device's shareable pages): the family's two halves in two processes (bytes bit-exact for views
of any strides, the sender's free deferred while the receiver holds any view, fallbacks), the
option's checks, and two worker processes of a LocalCluster."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import rrmm
import rrmm.mr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rrmm import _dask_share

distributed = pytest.importorskip("distributed")

from rrmm.dask import RRMMSetup, options_from_config

PAGE = 2 << 20
#: The host stand-in's options (2 MiB pages: rrmm's default page on a shareable host pool
#: panics when a block is named, see the report of issue 49's Dask bullet).
HOST_POOL = {"pageable_host": True, "device_capacity": 64 << 20, "reserve_size": 64 << 20,
             "page_size": PAGE}

RECEIVER = textwrap.dedent(
    """
    import gc, hashlib, json, sys
    import numpy as np
    from rrmm import _dask_share

    held = {}
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "get":
            header = json.loads(rest)
            array = _dask_share.deserialize(header, [])
            held[header["name"]] = array
            print(json.dumps([hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest(),
                              array.dtype.str, list(array.shape), array.flags.writeable]),
                  flush=True)
            del array
        elif command == "view":  # keep a view of the array only
            held[rest] = held[rest][1:]
            gc.collect()
            print("ok", flush=True)
        elif command == "drop":
            del held[rest]
            gc.collect()
            print("ok", flush=True)
    """
)


class _Block:
    """A pool block seen by NumPy (``numpy.asarray``): an array over it keeps it alive."""

    def __init__(self, buffer: Any, nbytes: int) -> None:
        self.buffer = buffer
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (buffer.ptr, False), "version": 3}


def _pool_array(nbytes: int, mr: Any = None) -> np.ndarray:
    """``nbytes`` of the pool (the current resource by default), as bytes, zeroed."""
    array = np.asarray(_Block(rrmm.DeviceBuffer(size=nbytes, mr=mr), nbytes))
    array[:] = 0
    return array


class _Receiver:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the receiver died"
        return answer.strip()

    def get(self, header: dict[str, Any]) -> list[Any]:
        return json.loads(self.ask("get " + json.dumps(header)))

    def close(self) -> None:
        self.proc.communicate("", timeout=30)


@pytest.fixture(scope="module")
def sender() -> Iterator[tuple[Any, _Receiver]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RRMM_LEDGER_DIR", tempfile.mkdtemp(prefix="rl"))
        pool = rrmm.mr.ExpandableMemoryResource(shareable=True, **HOST_POOL)  # type: ignore[arg-type]
        _dask_share.start(pool, "tcp://sender:1", None)
        receiver = _Receiver()
        yield pool, receiver
        receiver.close()
        _dask_share.stop()


def _figure(pool: Any, key: str) -> int:
    return int(pool.share_figures()[key])


def _wait_for(pool: Any, key: str, value: int) -> None:
    deadline = time.monotonic() + 10
    while _figure(pool, key) != value:
        assert time.monotonic() < deadline, pool.share_figures()
        time.sleep(0.01)


DTYPES = ["|u1", "<i2", "<f4", "<f8", "<c16", "|b1", ">i4"]


@st.composite
def _views(draw: Any) -> tuple[str, tuple[int, ...], list[slice], bool]:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 24), min_size=1, max_size=3)))
    slices = [
        slice(draw(st.integers(-n, n)), draw(st.integers(-n, n) | st.none()),
              draw(st.sampled_from([1, 2, 3, -1, -2])))
        for n in shape
    ]
    return dtype, shape, slices, draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_views(), seed=st.integers(0, 2**32 - 1))
def test_any_view_arrives_bit_exact_and_read_only(
    sender: tuple[Any, _Receiver], case: tuple[str, tuple[int, ...], list[slice], bool],
    seed: int,
) -> None:
    pool, receiver = sender
    dtype, shape, slices, transpose = case
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = _pool_array(nbytes, pool)
    raw[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    if dtype == "|b1":
        raw[:] &= 1
    view = raw.view(dtype).reshape(shape)[tuple(slices)]
    if transpose:
        view = view.T
    if view.size == 0:
        with pytest.raises(NotImplementedError):
            _dask_share.serialize(view)
        return
    header, frames = _dask_share.serialize(view)
    assert frames == [] and header["kind"] == "numpy"
    digest, got_dtype, got_shape, writeable = receiver.get(header)
    assert digest == hashlib.sha256(np.ascontiguousarray(view).tobytes()).hexdigest()
    assert (got_dtype, tuple(got_shape)) == (view.dtype.str, view.shape)
    assert writeable is False
    assert receiver.ask(f"drop {header['name']}") == "ok"


def test_the_senders_free_waits_for_the_receivers_last_view(
    sender: tuple[Any, _Receiver],
) -> None:
    pool, receiver = sender
    _wait_for(pool, "deferred_free_blocks", 0)
    after_wait = _figure(pool, "frees_after_wait")
    array = _pool_array(1 << 20, pool).view("<f4").reshape(512, 512)
    array[:] = np.arange(512 * 512, dtype="<f4").reshape(512, 512)
    header, _ = _dask_share.serialize(array[7:, 3:])  # a view: its base block is named
    assert header["offset"] == (7 * 512 + 3) * 4
    receiver.get(header)
    assert receiver.ask(f"view {header['name']}") == "ok"  # the array gone, a view kept
    del array
    gc.collect()
    assert _figure(pool, "deferred_free_blocks") == 1, "the receiver holds a view of it"
    assert _figure(pool, "deferred_free_bytes") >= 1 << 20
    assert receiver.ask(f"drop {header['name']}") == "ok"
    _wait_for(pool, "deferred_free_blocks", 0)
    assert _figure(pool, "frees_after_wait") == after_wait + 1


def test_what_cannot_go_by_name_goes_by_the_next_family(
    sender: tuple[Any, _Receiver],
) -> None:
    from distributed.protocol.serialize import deserialize, serialize

    pool, _ = sender
    families = [_dask_share.FAMILY, "dask", "pickle"]
    for value in (np.arange(10.0), np.array([object()] * 3), [1, 2], "text",
                  np.zeros(3, dtype=[("a", "<i4")])):
        with pytest.raises(NotImplementedError):
            _dask_share.serialize(value)
    plain = np.arange(10.0)  # malloc's memory, not the pool's
    header, frames = serialize(plain, serializers=families, on_error="raise")
    assert header["serializer"] != _dask_share.FAMILY
    assert np.array_equal(deserialize(header, frames), plain)
    shared = _pool_array(64, pool)
    header, frames = serialize(shared, serializers=families, on_error="raise")
    assert header["serializer"] == _dask_share.FAMILY and frames == []
    # In one process the receiver's half attaches to this process's own publication.
    back = deserialize(header, frames)
    assert back.ctypes.data != shared.ctypes.data and np.array_equal(back, shared)
    del back, shared
    gc.collect()


def test_get_data_tries_the_family_first_only_for_a_worker_on_this_device(
    sender: tuple[Any, _Receiver],
) -> None:
    del sender  # the publication it made is what counts
    assert _dask_share.serializers_for(None, None) is None
    assert _dask_share.serializers_for("tcp://elsewhere:2", ["dask"]) == ["dask"]
    assert _dask_share.serializers_for("tcp://sender:1", None) is None, "itself"
    other = rrmm.mr.ExpandableMemoryResource(shareable=True, **HOST_POOL)  # type: ignore[arg-type]
    peer = other.publish(_dask_share.publication_name("tcp://peer:3"))
    try:
        assert _dask_share.serializers_for("tcp://peer:3", None) == [
            _dask_share.FAMILY, "dask", "pickle"]
        assert _dask_share.serializers_for("tcp://peer:3", ["cuda", "dask"]) == [
            _dask_share.FAMILY, "cuda", "dask"]
    finally:
        peer.close()
    assert _dask_share.serializers_for("tcp://peer:3", ["dask"]) == ["dask"]


def test_without_a_publication_nothing_goes_by_name() -> None:
    saved = _dask_share._publication
    _dask_share._publication = None
    try:
        with pytest.raises(NotImplementedError, match="no publication"):
            _dask_share.serialize(np.arange(3))
        assert _dask_share.serializers_for("tcp://any:1", ["dask"]) == ["dask"]
    finally:
        _dask_share._publication = saved


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({}, ValueError, r"allocator=None.*pass allocator='expandable'"),
        ({"allocator": "pool", "initial_pool_size": "1GiB"}, ValueError, "allocator='pool'"),
        ({"allocator": "expandable", "managed_memory": True}, ValueError,
         "rmm_managed_memory=True"),
        ({"async_alloc": True}, ValueError, "rmm_async=True"),
        ({"allocator": "expandable", "simulate": "8GiB"}, ValueError, "simulate="),
    ],
)
def test_share_arrays_needs_the_expandable_pool(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=rf"share_arrays=True.*{message}"):
        RRMMSetup(share_arrays=True, **options)


def test_share_arrays_is_a_bool_and_read_from_the_config() -> None:
    import dask

    with pytest.raises(TypeError, match="`share_arrays` must be True or False, not 'yes'"):
        RRMMSetup(allocator="expandable", share_arrays="yes")  # type: ignore[arg-type]
    assert RRMMSetup(allocator="expandable", share_arrays=True).share_arrays is True
    assert RRMMSetup().share_arrays is False
    with dask.config.set({"rrmm": {"allocator": "expandable", "share-arrays": True}}):
        assert options_from_config() == {"allocator": "expandable", "share_arrays": True}


# ---------------------------------------------------------------- two Dask workers


def _make(n: int) -> np.ndarray:
    """On a worker: ``n`` float64 of the worker's (shareable) pool."""
    array = _pool_array(n * 8).view("<f8")
    array[:] = np.arange(n, dtype="<f8")
    return array


def _consume(array: np.ndarray) -> tuple[float, bool]:
    return float(array.sum()), bool(array.flags.writeable)


def _share_figures() -> dict[str, int]:
    from rrmm.dask import _find, _state

    pool = _find(_state.resource, rrmm.mr.ExpandableMemoryResource)
    return dict(pool.share_figures())


def test_two_workers_of_one_host_pool_hand_an_array_over_by_attaching(monkeypatch) -> None:
    from distributed import Client, LocalCluster

    monkeypatch.setenv("RRMM_LEDGER_DIR", tempfile.mkdtemp(prefix="rl"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        plugin = RRMMSetup(allocator="expandable", share_arrays=True)
        plugin._share_pool_options = dict(HOST_POOL)
        client.register_plugin(plugin)
        a, b = sorted(client.scheduler_info()["workers"])
        n = 300_000  # 2.4 MB: across two pages
        made = client.submit(_make, n, workers=[a])
        total, writeable = client.submit(_consume, made, workers=[b]).result()
        assert total == n * (n - 1) / 2
        assert writeable is False, "attached (a copy would be writable)"
        held = client.submit(lambda x: x, made, workers=[b], pure=False)
        held.result()  # b holds its received array now
        figures = client.run(_share_figures)
        assert figures[a]["leases"] >= 1 and figures[a]["importers"] == 1
        del made  # a frees its array: deferred while b holds it
        deadline = time.monotonic() + 20
        while client.run(_share_figures)[a]["deferred_free_blocks"] != 1:
            assert time.monotonic() < deadline, client.run(_share_figures)
            time.sleep(0.05)
        del held
        while client.run(_share_figures)[a]["deferred_free_blocks"] != 0:
            assert time.monotonic() < deadline, client.run(_share_figures)
            time.sleep(0.05)
        assert client.run(_share_figures)[a]["frees_after_wait"] == 1
        # An array outside the pool goes by Dask's own serializers (a writable copy).
        plain = client.submit(np.arange, 1000.0, workers=[a])
        assert client.submit(_consume, plain, workers=[b]).result() == (499500.0, True)


def test_a_peer_is_found_where_the_ledger_path_is_too_long_for_a_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Sockets whose path passes the kernel's limit (108 bytes) lie in a short directory of
    # their own, named with a hash: the peer's path is made the same way, not next to ours.
    deep = os.path.join(tempfile.mkdtemp(prefix="rl"), "a-rather-long-ledger-directory" * 3)
    os.makedirs(deep, mode=0o700)
    monkeypatch.setenv("RRMM_LEDGER_DIR", deep)
    mine = rrmm.mr.ExpandableMemoryResource(shareable=True, **HOST_POOL)  # type: ignore[arg-type]
    other = rrmm.mr.ExpandableMemoryResource(shareable=True, **HOST_POOL)  # type: ignore[arg-type]
    _dask_share.start(mine, "tcp://long-sender:1", None)
    peer = other.publish(_dask_share.publication_name("tcp://long-peer:2"))
    try:
        assert _dask_share._publication is not None
        assert not _dask_share._publication.path.startswith(deep), "the short directory"
        assert _dask_share.serializers_for("tcp://long-peer:2", ["dask"]) == [
            _dask_share.FAMILY, "dask"]
    finally:
        peer.close()
        _dask_share.stop()
