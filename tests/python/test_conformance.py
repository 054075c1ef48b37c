"""One conformance suite run over every resource class of ``rrmm.mr`` (issue 12): round trips,
256-byte alignment, zero-size allocations, the upstream accessors and the out-of-memory type.

Suballocators and adaptors are built over SimulatedMemoryResource (their bookkeeping, checked
by the upstream's counters) and over SystemMemoryResource (bytes really move). The base
resources that need a GPU skip with the reason where there is none.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import gpu_available, gpu_skip_reason
from rrmm import mr
from rrmm.mr import experimental
from rrmm.pylibrmm.device_buffer import DeviceBuffer, to_device

MiB = 1 << 20
SIZES = [1, 255, 256, 257, 1000, 4096, MiB + 1]

_LOG_DIR = Path(tempfile.mkdtemp(prefix="rrmm-conformance-"))


def _callback_over(up: Any) -> Any:
    return mr.CallbackMemoryResource(
        lambda n, stream: up.allocate(n, stream), lambda p, n, stream: up.deallocate(p, n, stream)
    )


#: Classes that wrap an upstream: name -> factory(upstream).
ADAPTORS: dict[str, Callable[[Any], Any]] = {
    "PoolMemoryResource": lambda up: mr.PoolMemoryResource(up, MiB),
    "FixedSizeMemoryResource": lambda up: mr.FixedSizeMemoryResource(up, 2 * MiB, 4),
    "BinningMemoryResource": lambda up: mr.BinningMemoryResource(up, 8, 14),
    "LimitingResourceAdaptor": lambda up: mr.LimitingResourceAdaptor(up, 256 * MiB),
    "LoggingResourceAdaptor": lambda up: mr.LoggingResourceAdaptor(up, str(_LOG_DIR / "c.csv")),
    "StatisticsResourceAdaptor": lambda up: mr.StatisticsResourceAdaptor(up),
    "TrackingResourceAdaptor": lambda up: mr.TrackingResourceAdaptor(up),
    "FailureCallbackResourceAdaptor": lambda up: mr.FailureCallbackResourceAdaptor(
        up, lambda n: False
    ),
    "PrefetchResourceAdaptor": lambda up: mr.PrefetchResourceAdaptor(up),
    "AlignedResourceAdaptor": lambda up: mr.AlignedResourceAdaptor(up, 4096, 8192),
    # Falls back to a device of its own (the suite's out-of-memory check fills both).
    "FallbackResourceAdaptor": lambda up: mr.FallbackResourceAdaptor(
        up, mr.SimulatedMemoryResource("64MiB")
    ),
    # Tiers after the upstream: a simulated peer GPU and simulated host memory.
    "TieredMemoryResource": lambda up: mr.TieredMemoryResource(
        up, [mr.SimulatedMemoryResource("64MiB"), mr.SimulatedMemoryResource("64MiB")]
    ),
}
if hasattr(mr, "ArenaMemoryResource"):
    ADAPTORS["ArenaMemoryResource"] = lambda up: mr.ArenaMemoryResource(up, 64 * MiB)


#: Source resources that run without a GPU: name -> factory(). Callback goes through Python.
CPU_BASES: dict[str, Callable[[], Any]] = {
    "SimulatedMemoryResource": lambda: mr.SimulatedMemoryResource("1GiB"),
    "SystemMemoryResource": lambda: mr.SystemMemoryResource(),
    "SamHeadroomMemoryResource": lambda: mr.SamHeadroomMemoryResource("1MiB"),
    "CallbackMemoryResource": lambda: _callback_over(mr.SimulatedMemoryResource("1GiB")),
}


#: Owners of the pools the view resources use (kept alive for the session).
_KEEP: list[Any] = []


def _async_view() -> Any:
    owner = mr.CudaAsyncMemoryResource()
    _KEEP.append(owner)
    return mr.CudaAsyncViewMemoryResource(owner.pool_handle())


#: Source resources that need a GPU.
GPU_BASES: dict[str, Callable[[], Any]] = {
    "CudaMemoryResource": lambda: mr.CudaMemoryResource(),
    "ManagedMemoryResource": lambda: mr.ManagedMemoryResource(),
    "PinnedHostMemoryResource": lambda: mr.PinnedHostMemoryResource(),
    "CudaAsyncMemoryResource": lambda: mr.CudaAsyncMemoryResource(),
    "CudaAsyncViewMemoryResource": _async_view,
    "CudaAsyncManagedMemoryResource": lambda: experimental.CudaAsyncManagedMemoryResource(),
}

#: Classes with a constructor of their own, checked by a suite of their own.
OWN_SUITES = {
    "ExpandableMemoryResource": "test_expandable.py",
    # Needs two GPUs with a peer link.
    "PeerMemoryResource": "test_peer_tier.py",
    # Takes expandable pools, one per tag (its own state machine: EngineMachine).
    "TaggedMemoryResource": "test_engine_sleep_apis.py",
}

#: Classes that keep memory they grew after it is freed.
SUBALLOCATORS = {
    "PoolMemoryResource",
    "FixedSizeMemoryResource",
    "BinningMemoryResource",
    "ArenaMemoryResource",
}

#: Abstract bases: not instantiable.
ABSTRACT = {"DeviceMemoryResource", "UpstreamResourceAdaptor"}

#: Resources whose memory can be read and written from the host without a GPU.
HOST_DATA = {"SystemMemoryResource", "SamHeadroomMemoryResource"}


def _cases() -> list[Any]:
    cases = []
    for name in ADAPTORS:
        cases.append(pytest.param((name, "simulated"), id=f"{name}-over-simulated"))
        marks = []
        if name == "ArenaMemoryResource" and not gpu_available():
            marks = [pytest.mark.skip(reason="the arena synchronizes streams through the driver")]
        cases.append(pytest.param((name, "system"), id=f"{name}-over-system", marks=marks))
    for name in CPU_BASES:
        cases.append(pytest.param((name, None), id=name))
    gpu = pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
    for name in GPU_BASES:
        cases.append(pytest.param((name, None), id=name, marks=gpu))
    return cases


CASES = _cases()


class Built:
    """A resource under test, its upstream (None for a source resource) and the simulated device
    at the bottom of the chain, if any."""

    def __init__(self, name: str, over: str | None) -> None:
        self.name = name
        self.sim: Any = None
        if over is None:
            self.upstream = None
            make = CPU_BASES.get(name) or GPU_BASES[name]
            self.mr = make()
            if name == "SimulatedMemoryResource":
                self.sim = self.mr
        else:
            if over == "simulated":
                self.sim = mr.SimulatedMemoryResource("1GiB")
                self.upstream = self.sim
            else:
                self.upstream = mr.SystemMemoryResource()
            self.mr = ADAPTORS[name](self.upstream)

    @property
    def moves_bytes(self) -> bool:
        """Whether the memory is real (a data round trip is possible here)."""
        if self.sim is not None or self.name == "CallbackMemoryResource":
            return False
        if self.name in GPU_BASES:
            return True
        return self.upstream is not None or self.name in HOST_DATA

    def in_use(self) -> int | None:
        return None if self.sim is None else self.sim.bytes_in_use()


@pytest.fixture(params=CASES)
def built(request: pytest.FixtureRequest) -> Built:
    name, over = request.param
    return Built(name, over)


def test_round_trip(built):
    r = built.mr
    baseline = built.in_use()
    for _ in range(2):  # twice: freed memory is reused correctly
        ptrs = [(r.allocate(n), n) for n in SIZES]
        spans = sorted(ptrs)
        for (a, n), (b, _) in itertools.pairwise(spans):
            assert a + n <= b, f"{hex(a)}+{n} overlaps {hex(b)}"
        for p, n in reversed(ptrs):
            r.deallocate(p, n)
    # Suballocators may keep what they grew; adaptors give everything back.
    if baseline is not None and built.name not in SUBALLOCATORS:
        assert built.in_use() == baseline
    if built.name == "SimulatedMemoryResource":
        assert r.bytes_in_use() == 0 and r.live_allocations() == 0


def test_data_round_trip(built):
    if not built.moves_bytes:
        pytest.skip(f"{built.name} over simulated memory has no bytes to move")
    payload = bytes(range(256)) * 40 + b"tail"
    buf = to_device(payload, mr=built.mr)
    assert buf.mr is built.mr
    assert buf.tobytes() == payload
    copy = buf.copy()
    assert copy.tobytes() == payload and copy.ptr != buf.ptr
    other = DeviceBuffer(size=len(payload), mr=built.mr)
    other.copy_from_device(buf)
    assert other.tobytes() == payload


def test_alignment(built):
    r = built.mr
    ptrs = [(r.allocate(n), n) for n in (1, 3, 255, 257, 1023, 4097)]
    try:
        for p, n in ptrs:
            assert p % 256 == 0, f"{built.name}: {hex(p)} for {n} bytes is not 256-aligned"
    finally:
        for p, n in ptrs:
            r.deallocate(p, n)


def test_zero_size(built):
    r = built.mr
    baseline = built.in_use()
    assert r.allocate(0) == 0
    r.deallocate(0, 0)
    assert built.in_use() == baseline
    buf = DeviceBuffer(size=0, mr=r)
    assert buf.size == 0 and buf.ptr == 0


def test_upstream_accessors(built):
    r = built.mr
    if built.upstream is None:
        assert not isinstance(r, mr.UpstreamResourceAdaptor)
        assert not hasattr(r, "upstream_mr") and not hasattr(r, "get_upstream")
    else:
        assert isinstance(r, mr.UpstreamResourceAdaptor)
        assert r.upstream_mr is built.upstream
        assert r.get_upstream() is built.upstream
    assert isinstance(r, mr.DeviceMemoryResource)
    assert type(r).__name__ == built.name


def _small(name: str, over: str | None) -> Any:
    """The resource over (or as) a device too small for the request below."""
    small = mr.SimulatedMemoryResource("64MiB")
    if over is not None:
        return ADAPTORS[name](small)
    if name == "SimulatedMemoryResource":
        return small
    if name == "CallbackMemoryResource":
        return _callback_over(small)
    return (CPU_BASES.get(name) or GPU_BASES[name])()


@pytest.mark.parametrize("case", CASES)
def test_out_of_memory_is_memory_error(case):
    name, over = case
    if name in GPU_BASES and not gpu_available():
        pytest.skip(gpu_skip_reason())
    r = _small(name, over)
    # More than the simulated device, the host or any GPU has.
    on_simulated = over is not None or (name in CPU_BASES and name not in HOST_DATA)
    request = 1 << 30 if on_simulated else 1 << 60
    with pytest.raises(MemoryError) as info:
        r.allocate(request)
    assert type(info.value) is MemoryError
    assert re.search(r"failed to allocate \d+ bytes", str(info.value)), str(info.value)
    # Still usable after the failure.
    p = r.allocate(1000)
    r.deallocate(p, 1000)


def test_every_class_is_covered():
    # ExpandableMemoryResource has its own constructor (a device, or simulated_capacity) and
    # its own suite: test_expandable.py.
    covered = set(ADAPTORS) | set(CPU_BASES) | set(GPU_BASES) | ABSTRACT | set(OWN_SUITES)
    classes = {
        name
        for module in (mr, experimental)
        for name in module.__all__
        if isinstance(getattr(module, name), type)
        and issubclass(getattr(module, name), mr.DeviceMemoryResource)
    }
    assert classes - covered == set(), "classes of rrmm.mr the conformance suite misses"
    assert covered - classes == set(), "the suite names classes rrmm.mr does not export"


@pytest.mark.parametrize("name", sorted(ABSTRACT))
def test_abstract_bases_are_not_instantiable(name):
    with pytest.raises(TypeError, match="cannot create"):
        getattr(mr, name)()
