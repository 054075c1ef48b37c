"""Bad input at the Python boundary (issue 9): every case checks the exception's exact type and
its message, then that the resource still allocates and frees with its counters right.

Cases that killed the interpreter (or could) run in a child process (`child` fixture in
conftest.py), so a crash fails that one test and not the run. Without a GPU everything runs on
SimulatedMemoryResource (pointers only) and SystemMemoryResource (host memory).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rrmm
from conftest import gpu_available, gpu_skip_reason
from resource_checks import assert_still_works, counters, make_resources
from rrmm import _rrmm, mr
from rrmm.pylibrmm.device_buffer import (
    DeviceBuffer,
    copy_device_to_ptr,
    copy_host_to_ptr,
    copy_ptr_to_host,
    to_device,
)

GiB = 1 << 30
MiB = 1 << 20


def raises(exc_type: type[BaseException], pattern: str, fn: Callable[[], Any]) -> BaseException:
    """Calls fn(); it must raise exactly exc_type (not a subclass) with a message matching
    pattern."""
    with pytest.raises(BaseException) as info:
        fn()
    assert type(info.value) is exc_type, f"raised {type(info.value).__name__}: {info.value}"
    assert re.search(pattern, str(info.value)), f"{str(info.value)!r} !~ {pattern!r}"
    return info.value


@pytest.fixture
def sim():
    return mr.SimulatedMemoryResource("1GiB")


# ------------------------------------------------------------------------------ constructors

CONSTRUCTORS: list[tuple[str, Callable[[Any], Any], type[BaseException], str]] = [
    ("sim-negative", lambda s: mr.SimulatedMemoryResource(-1), OverflowError, r"size must be a non-negative"),
    ("sim-unparsable", lambda s: mr.SimulatedMemoryResource("abc"), ValueError, r"Could not parse 'abc'"),
    ("sim-float", lambda s: mr.SimulatedMemoryResource(1.5), TypeError, r"size must be an int .* not float"),
    ("sim-none", lambda s: mr.SimulatedMemoryResource(None), TypeError, r"size must be an int.*NoneType"),
    ("pool-none-upstream", lambda s: mr.PoolMemoryResource(None), TypeError, r"upstream_mr"),
    ("pool-int-upstream", lambda s: mr.PoolMemoryResource(5), TypeError, r"upstream_mr must be a DeviceMemoryResource, not int"),
    ("pool-unaligned-initial", lambda s: mr.PoolMemoryResource(s, 1000), RuntimeError, r"multiple of 256"),
    ("pool-initial-over-max", lambda s: mr.PoolMemoryResource(s, MiB, MiB // 2), RuntimeError, r"exceeds the maximum pool size"),
    ("pool-unparsable-initial", lambda s: mr.PoolMemoryResource(s, "x"), ValueError, r"Could not parse 'x'"),
    ("pool-negative-initial", lambda s: mr.PoolMemoryResource(s, -5), OverflowError, r"initial_pool_size"),
    ("pool-initial-over-device", lambda s: mr.PoolMemoryResource(s, 2 * GiB), MemoryError, r"failed to allocate 2147483648 bytes"),
    ("fixed-zero-block", lambda s: mr.FixedSizeMemoryResource(s, 0), ValueError, r"block_size"),
    ("fixed-float-block", lambda s: mr.FixedSizeMemoryResource(s, 1.5), TypeError, r"block_size must be an int"),
    ("fixed-negative-count", lambda s: mr.FixedSizeMemoryResource(s, MiB, -1), OverflowError, r"negative"),
    ("binning-max-exponent", lambda s: mr.BinningMemoryResource(s, 10, 70), ValueError, r"max_size_exponent"),
    ("binning-none-upstream", lambda s: mr.BinningMemoryResource(None), TypeError, r"upstream_mr"),
    ("binning-add-zero-bin", lambda s: mr.BinningMemoryResource(s).add_bin(0), ValueError, r"allocation_size"),
    ("binning-add-int-bin-mr", lambda s: mr.BinningMemoryResource(s).add_bin(1024, 5), TypeError, r"DeviceMemoryResource, not int"),
    ("limiting-negative", lambda s: mr.LimitingResourceAdaptor(s, -1), OverflowError, r"allocation_limit"),
    ("limiting-unparsable", lambda s: mr.LimitingResourceAdaptor(s, "lots"), ValueError, r"Could not parse 'lots'"),
    ("limiting-none-upstream", lambda s: mr.LimitingResourceAdaptor(None, 1024), TypeError, r"upstream_mr"),
    ("aligned-not-power-of-2", lambda s: mr.AlignedResourceAdaptor(s, 100), ValueError, r"100: allocation alignment is not a power of 2"),
    ("aligned-zero", lambda s: mr.AlignedResourceAdaptor(s, 0), ValueError, r"not a power of 2"),
    ("aligned-negative-threshold", lambda s: mr.AlignedResourceAdaptor(s, 256, -1), OverflowError, r"negative"),
    ("failure-callback-not-callable", lambda s: mr.FailureCallbackResourceAdaptor(s, 5), TypeError, r"callback must be callable"),
    ("failure-callback-none-upstream", lambda s: mr.FailureCallbackResourceAdaptor(None, bool), TypeError, r"upstream_mr"),
    ("callback-not-callable", lambda s: mr.CallbackMemoryResource(1, 2), TypeError, r"must be callable"),
    ("statistics-int-upstream", lambda s: mr.StatisticsResourceAdaptor(5), TypeError, r"upstream_mr"),
    ("tracking-str-upstream", lambda s: mr.TrackingResourceAdaptor("x"), TypeError, r"upstream_mr"),
    ("prefetch-none-upstream", lambda s: mr.PrefetchResourceAdaptor(None), TypeError, r"upstream_mr"),
    ("logging-none-upstream", lambda s: mr.LoggingResourceAdaptor(None, "x.csv"), TypeError, r"upstream_mr"),
    ("sam-headroom-negative", lambda s: mr.SamHeadroomMemoryResource(-1), OverflowError, r"headroom"),
    ("arena-negative-size", lambda s: mr.ArenaMemoryResource(s, -1), OverflowError, r"arena_size must be a non-negative"),
    ("arena-unparsable-size", lambda s: mr.ArenaMemoryResource(s, "x"), ValueError, r"Could not parse 'x'"),
    ("arena-float-size", lambda s: mr.ArenaMemoryResource(s, 1.5), TypeError, r"arena_size must be an int"),
    ("arena-zero-size", lambda s: mr.ArenaMemoryResource(s, 0), RuntimeError, r"smaller than minimum superblock size"),
    ("arena-over-device", lambda s: mr.ArenaMemoryResource(s, 2 * GiB), MemoryError, r"failed to allocate 2147483648 bytes"),
    ("arena-none-upstream", lambda s: mr.ArenaMemoryResource(None), TypeError, r"upstream_mr"),
    ("async-view-str-handle", lambda s: mr.CudaAsyncViewMemoryResource("x"), TypeError, r"pool_handle"),
    ("async-view-null-handle", lambda s: mr.CudaAsyncViewMemoryResource(0), ValueError, r"pool_handle.*null"),
    ("async-unparsable-initial", lambda s: mr.CudaAsyncMemoryResource(initial_pool_size="x"), ValueError, r"Could not parse 'x'"),
    ("async-negative-threshold", lambda s: mr.CudaAsyncMemoryResource(release_threshold=-1), OverflowError, r"release_threshold"),
]  # fmt: skip


@pytest.mark.parametrize(
    "make, exc, pattern", [c[1:] for c in CONSTRUCTORS], ids=[c[0] for c in CONSTRUCTORS]
)
def test_constructor_rejects(sim, make, exc, pattern):
    before = counters(sim)
    raises(exc, pattern, lambda: make(sim))
    # Nothing was taken from the upstream, and it still works.
    assert_still_works(sim, before)


NO_DRIVER_CONSTRUCTORS = [
    mr.CudaMemoryResource,
    mr.ManagedMemoryResource,
    mr.PinnedHostMemoryResource,
    mr.CudaAsyncMemoryResource,
    mr.experimental.CudaAsyncManagedMemoryResource,
]


@pytest.mark.skipif(_rrmm.driver_available(), reason="checks the errors without a CUDA driver")
@pytest.mark.parametrize("cls", NO_DRIVER_CONSTRUCTORS, ids=lambda c: c.__name__)
def test_gpu_constructor_without_driver(cls):
    raises(RuntimeError, r"no CUDA driver", cls)


# ---------------------------------------------------------------- allocate/deallocate per resource


def _resources(tmp_path: Path) -> dict[str, Callable[[Any], Any]]:
    return make_resources(str(tmp_path / "log.csv"))


RESOURCE_NAMES = list(_resources(Path(".")))

BAD_CALLS: list[tuple[str, Callable[[Any], Any], type[BaseException], str]] = [
    ("allocate-negative", lambda r: r.allocate(-1), OverflowError, r"negative"),
    ("allocate-too-big-for-size_t", lambda r: r.allocate(2**64), OverflowError, r"too big"),
    ("allocate-str", lambda r: r.allocate("16"), TypeError, r"'str' object cannot be interpreted as an integer"),
    ("allocate-bad-stream", lambda r: r.allocate(16, stream="s"), TypeError, r"cannot make a Stream from an object of type str"),
    ("deallocate-negative-ptr", lambda r: r.deallocate(-1, 8), OverflowError, r"negative"),
    ("deallocate-str-size", lambda r: r.deallocate(0x1000, "8"), TypeError, r"'str' object cannot be interpreted as an integer"),
]  # fmt: skip


@pytest.mark.parametrize("resource", RESOURCE_NAMES)
@pytest.mark.parametrize(
    "call, exc, pattern", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_call_leaves_resource_working(tmp_path, sim, resource, call, exc, pattern):
    r = _resources(tmp_path)[resource](sim)
    before = counters(r)
    raises(exc, pattern, lambda: call(r))
    assert_still_works(r, before)


def test_out_of_memory_is_memory_error_and_leaves_resource_working(tmp_path):
    for name, make in _resources(tmp_path).items():
        if name == "system":
            continue
        small = mr.SimulatedMemoryResource("64MiB")
        r = make(small)
        before = counters(r)
        raises(MemoryError, r"out_of_memory|out of memory", lambda r=r: r.allocate(GiB))
        assert_still_works(r, before)


# Bogus, double and foreign frees run in a child: before issue 9 some of them crashed or
# corrupted the resource's state.
_CHILD_RESOURCES = f"""
import os, sys, tempfile
sys.path.insert(0, {str(Path(__file__).parent)!r})
from resource_checks import assert_still_works, counters, make_resources
sim = mr.SimulatedMemoryResource("1GiB")
MAKE = make_resources(os.path.join(tempfile.mkdtemp(), "log.csv"))
"""

FREE_PATTERN = r"0x[0-9a-f]+.*(not allocated|did not allocate|freed|double free|unknown)"


@pytest.mark.parametrize("resource", RESOURCE_NAMES)
def test_bogus_free_is_an_error(child, resource):
    child(
        _CHILD_RESOURCES
        + f"""
r = MAKE[{resource!r}](sim)
before = counters(r)
expect(RuntimeError, {FREE_PATTERN!r}, lambda: r.deallocate(0x1000, 8))
assert_still_works(r, before)
print("CHILD OK")
"""
    )


@pytest.mark.parametrize("resource", RESOURCE_NAMES)
def test_double_free_is_an_error(child, resource):
    child(
        _CHILD_RESOURCES
        + f"""
r = MAKE[{resource!r}](sim)
before = counters(r)
a = r.allocate(100)
r.deallocate(a, 100)
expect(RuntimeError, {FREE_PATTERN!r}, lambda: r.deallocate(a, 100))
# The block is not handed out twice.
b, c = r.allocate(100), r.allocate(100)
assert b != c, hex(b)
r.deallocate(b, 100)
r.deallocate(c, 100)
assert_still_works(r, before)
print("CHILD OK")
"""
    )


# Frees with the wrong size, where the resource knows the size (or its counter would go
# below zero): a logic error, and nothing changes (the right free then works).
@pytest.mark.parametrize(
    "resource",
    ["simulated", "system", "limiting", "tracking", "statistics", "pool", "fixed_size", "binning", "arena"],
)
def test_wrong_size_free_is_an_error(child, resource):
    child(
        _CHILD_RESOURCES
        + f"""
r = MAKE[{resource!r}](sim)
before = counters(r)
a = r.allocate(1000)
during = counters(r)
expect(RuntimeError, r"size|bytes", lambda: r.deallocate(a, 1 << 20))
assert counters(r) == during, (counters(r), during)
r.deallocate(a, 1000)
assert_still_works(r, before)
print("CHILD OK")
"""
    )


# -------------------------------------------------------------- issue 9's reproducers, one each


# Each script runs in a child process (a crash fails that case only).
_REPRODUCERS = {
    "system_bogus_free_does_not_crash": """
s = mr.SystemMemoryResource()
expect(RuntimeError, r"0x1000", lambda: s.deallocate(0x1000, 8))
a = s.allocate(64)
s.deallocate(a, 64)
""",
    "fixed_size_double_free_hands_out_no_block_twice": """
f = mr.FixedSizeMemoryResource(mr.SimulatedMemoryResource(1 << 30))
a = f.allocate(100)
f.deallocate(a, 100)
expect(RuntimeError, hex(a), lambda: f.deallocate(a, 100))
assert f.allocate(100) != f.allocate(100)
expect(RuntimeError, r"0x1000", lambda: f.deallocate(0x1000, 100))
""",
    "limiting_wrong_size_free_does_not_wrap": """
lim = mr.LimitingResourceAdaptor(mr.SimulatedMemoryResource(1 << 30), 1 << 20)
a = lim.allocate(1024)
expect(RuntimeError, r"1048576|size", lambda: lim.deallocate(a, 1 << 20))
assert lim.get_allocated_bytes() <= 1 << 20, lim.get_allocated_bytes()
b = lim.allocate(16)  # not refused
lim.deallocate(b, 16)
""",
    "simulated_free_of_pool_pointer_on_upstream": """
s = mr.SimulatedMemoryResource(1 << 30)
p = mr.PoolMemoryResource(s, 1 << 20)
a = p.allocate(256)
expect(RuntimeError, r"size|bytes|not allocated", lambda: s.deallocate(a, 256))
assert s.bytes_in_use() == 1 << 20, s.bytes_in_use()
b = s.allocate(1 << 20)
assert not (a <= b < a + (1 << 20)), "the pool's chunk was handed out again"
s.deallocate(b, 1 << 20)
p.deallocate(a, 256)
""",
    "pool_keeps_initial_chunk_after_failed_request": """
s = mr.SimulatedMemoryResource(1 << 30)
p = mr.PoolMemoryResource(s, 256 << 20)
expect(MemoryError, r"2147483648", lambda: p.allocate(2 << 30))
assert p.pool_size() == 256 << 20, p.pool_size()
assert s.bytes_in_use() == 256 << 20, s.bytes_in_use()
""",
}


@pytest.mark.parametrize("script", list(_REPRODUCERS.values()), ids=list(_REPRODUCERS))
def test_issue9_reproducer(child, script):
    child(script + 'print("CHILD OK")\n')


_HOST_COPIES = {
    "DeviceBuffer-ptr": "DeviceBuffer(ptr=src.ctypes.data, size=src.nbytes).tobytes() == src.tobytes()",
    "DeviceBuffer-ptr-mr": "DeviceBuffer(ptr=src.ctypes.data, size=src.nbytes, mr=sys_mr).tobytes() == src.tobytes()",
    "copy_ptr_to_host": "(copy_ptr_to_host(src.ctypes.data, dst.view(np.uint8)) or True) and dst.tobytes() == src.tobytes()",
    "copy_host_to_ptr": "(copy_host_to_ptr(src.view(np.uint8), dst.ctypes.data) or True) and dst.tobytes() == src.tobytes()",
    "copy_device_to_ptr": "(copy_device_to_ptr(src.ctypes.data, dst.ctypes.data, src.nbytes) or True) and dst.tobytes() == src.tobytes()",
    "slices-from-threads": "threaded_slices()",
}


@pytest.mark.parametrize("call", list(_HOST_COPIES.values()), ids=list(_HOST_COPIES))
def test_pageable_host_memory_is_copied_as_rmm_does(child, call):
    """RMM's `DeviceBuffer(ptr=<host address>, size=n)` copies from pageable host memory (its
    docstring: "host or device memory"); so do the raw copies. Issue 18's regression: rrmm had
    refused every pageable host address. (On a machine without a GPU the copies are host
    copies; the GPU run checks the same through CUDA, beside RMM.)"""
    child(
        f"""
import threading
import numpy as np
mr.set_current_device_resource(mr.SystemMemoryResource())
sys_mr = mr.SystemMemoryResource()
src = np.arange(50000, dtype=np.float32)
dst = np.zeros_like(src)
def threaded_slices():
    out = [None] * 8
    def work(i):
        part = src[i * 6250:(i + 1) * 6250]
        out[i] = DeviceBuffer(ptr=part.ctypes.data, size=part.nbytes).tobytes()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return b"".join(out) == src.tobytes()
assert {call}
print("CHILD OK")
"""
    )


_SIM_COPIES = {
    "copy_ptr_to_host": "copy_ptr_to_host(p, bytearray(16))",
    "copy_host_to_ptr": "copy_host_to_ptr(b'x' * 16, p)",
    "copy_device_to_ptr-src": "copy_device_to_ptr(p, host.ptr, 16)",
    "copy_device_to_ptr-dst": "copy_device_to_ptr(host.ptr, p, 16)",
    "DeviceBuffer-ptr": "DeviceBuffer(ptr=p, size=16, mr=mr.SystemMemoryResource())",
    "copy_from_device": "host.copy_from_device(DeviceBuffer(size=16, mr=sim))",
    "copy_from_device-into-sim": "DeviceBuffer(size=16, mr=sim).copy_from_device(host)",
    "copy_from_host-into-sim": "DeviceBuffer(size=16, mr=sim).copy_from_host(b'x' * 16)",
    "to_device-sim": "to_device(b'x' * 16, mr=sim)",
    "resize-sim": "DeviceBuffer(size=16, mr=sim).resize(32)",
    "tobytes-sim": "DeviceBuffer(size=16, mr=sim).tobytes()",
    "copy-pool-over-sim": "DeviceBuffer(size=16, mr=mr.PoolMemoryResource(sim, 1 << 20)).copy()",
}


_BOGUS_COPIES = {
    "copy_ptr_to_host": "copy_ptr_to_host(BOGUS, bytearray(16))",
    "copy_host_to_ptr": "copy_host_to_ptr(b'x' * 16, BOGUS)",
    "copy_device_to_ptr-src": "copy_device_to_ptr(BOGUS, host.ptr, 16)",
    "copy_device_to_ptr-dst": "copy_device_to_ptr(host.ptr, BOGUS, 16)",
    "DeviceBuffer-ptr": "DeviceBuffer(ptr=BOGUS, size=16, mr=mr.SystemMemoryResource())",
    "copy_from_device": "host.copy_from_device(Cai(BOGUS, 16))",
    "read-only-destination": "copy_host_to_ptr(b'x' * 16, ro.ctypes.data)",
    "unmapped-after-mapped": "copy_ptr_to_host(tail, bytearray(32))",
    "past-the-end": "copy_ptr_to_host(host.ptr, bytearray(4096))",
}


@pytest.mark.parametrize("call", list(_BOGUS_COPIES.values()), ids=list(_BOGUS_COPIES))
def test_copy_through_a_bogus_address_is_an_error(child, call):
    """Addresses nothing vouches for: not known to CUDA, not a live rrmm system allocation, not
    host memory mapped with the access the copy needs (was SIGSEGV: the driver dereferences an
    address it does not know as pageable host memory); a range running past the end of the
    allocation that holds its start."""
    child(
        f"""
import mmap
import numpy as np
BOGUS = 0x1000
arr = np.zeros(16, dtype=np.uint8)
ro = np.frombuffer(mmap.mmap(-1, 4096, prot=mmap.PROT_READ), dtype=np.uint8)
two = mmap.mmap(-1, 2 * mmap.PAGESIZE)
base = np.frombuffer(two, dtype=np.uint8).ctypes.data
import ctypes
libc = ctypes.CDLL(None)
# The second page stays part of our mapping (so nothing the process maps later, CUDA's own
# mappings on a GPU machine among them, can land there), with no access: as unreadable as an
# unmapped page, for as long as `two` lives.
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0  # PROT_NONE
tail = base + mmap.PAGESIZE - 16
class Cai:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {{
            "data": (ptr, False), "shape": (n,), "strides": None, "typestr": "|u1", "version": 3,
        }}
host = DeviceBuffer(size=16, mr=mr.SystemMemoryResource())
expect(ValueError, r"not memory rrmm can copy|runs past the end", lambda: {call})
host.copy_from_host(b"y" * 16)
assert host.tobytes() == b"y" * 16
copy_ptr_to_host(host.ptr, arr)
assert arr.tobytes() == b"y" * 16
print("CHILD OK")
"""
    )


@pytest.mark.parametrize("call", list(_SIM_COPIES.values()), ids=list(_SIM_COPIES))
def test_copy_through_simulated_memory_is_an_error(child, call):
    child(
        f"""
sim = mr.SimulatedMemoryResource(1 << 30)
host = DeviceBuffer(size=16, mr=mr.SystemMemoryResource())
p = sim.allocate(16)
expect(RuntimeError, r"simulated", lambda: {call})
sim.deallocate(p, 16)
assert sim.live_allocations() == 0 and sim.bytes_in_use() == 0, sim.live_allocations()
host.copy_from_host(b"y" * 16)
assert host.tobytes() == b"y" * 16
print("CHILD OK")
"""
    )


@pytest.mark.parametrize("device", [2**40, 10**8, 2**63, 2**64, -1])
def test_set_per_device_resource_bad_ordinal(child, device):
    child(
        f"""
sim = mr.SimulatedMemoryResource(1 << 30)
start = time.monotonic()
expect(ValueError, r"(?<![0-9]){device}(?![0-9])", lambda: mr.set_per_device_resource({device}, sim))
expect(ValueError, r"(?<![0-9]){device}(?![0-9])", lambda: mr.get_per_device_resource({device}))
assert time.monotonic() - start < 2, "the check took too long"
mr.set_per_device_resource(0, sim)
assert mr.get_per_device_resource(0) is sim
print("CHILD OK")
""",
        timeout=30,
    )


# -------------------------------------------------------------------- DeviceBuffer and copies


BUFFER_CASES: list[tuple[str, Callable[[Any], Any], type[BaseException], str]] = [
    ("size-negative", lambda b: DeviceBuffer(size=-1), OverflowError, r"negative"),
    ("size-too-big", lambda b: DeviceBuffer(size=2**64), OverflowError, r"too big"),
    ("size-str", lambda b: DeviceBuffer(size="1"), TypeError, r"'str' object cannot be interpreted"),
    ("mr-int", lambda b: DeviceBuffer(size=16, mr=5), TypeError, r"mr must be a DeviceMemoryResource or None"),
    ("size-out-of-memory", lambda b: DeviceBuffer(size=2**62), MemoryError, r"failed to allocate 4611686018427387904 bytes"),
    ("resize-negative", lambda b: b.resize(-1), OverflowError, r"negative"),
    ("reserve-out-of-memory", lambda b: b.reserve(2**62), MemoryError, r"failed to allocate"),
    ("copy_from_host-too-large", lambda b: b.copy_from_host(b"x" * 32), ValueError, r"too large: 32 bytes into a buffer of 16"),
    ("copy_from_host-int", lambda b: b.copy_from_host(5), TypeError, r"bytes-like object is required"),
    ("copy_to_host-too-small", lambda b: b.copy_to_host(bytearray(4)), ValueError, r"too small: 4 bytes, need 16"),
    ("copy_to_host-read-only", lambda b: b.copy_to_host(b"x" * 16), ValueError, r"read-only"),
    ("copy_from_device-int", lambda b: b.copy_from_device(5), ValueError, r"__cuda_array_interface__"),
    ("copy_from_device-too-large", lambda b: b.copy_from_device(DeviceBuffer(size=32)), ValueError, r"too large: 32 bytes into a buffer of 16"),
    ("to_device-int", lambda b: to_device(5), TypeError, r"bytes-like object is required"),
    ("to_device-mr-int", lambda b: to_device(b"abc", mr=5), TypeError, r"mr must be a DeviceMemoryResource"),
    ("copy_ptr_to_host-null", lambda b: copy_ptr_to_host(0, bytearray(16)), ValueError, r"null pointer"),
    ("copy_host_to_ptr-null", lambda b: copy_host_to_ptr(b"x", 0), ValueError, r"null pointer"),
    ("copy_ptr_to_host-negative", lambda b: copy_ptr_to_host(-1, bytearray(16)), OverflowError, r"negative"),
    ("copy_ptr_to_host-str", lambda b: copy_ptr_to_host("x", bytearray(16)), TypeError, r"'str' object cannot be interpreted"),
    ("copy_ptr_to_host-read-only", lambda b: copy_ptr_to_host(b.ptr, b"immutable" * 2), ValueError, r"read-only"),
    ("copy_device_to_ptr-null", lambda b: copy_device_to_ptr(0, b.ptr, 16), ValueError, r"must not be null"),
]  # fmt: skip


@pytest.mark.parametrize(
    "call, exc, pattern", [c[1:] for c in BUFFER_CASES], ids=[c[0] for c in BUFFER_CASES]
)
def test_device_buffer_bad_input(system_mr, call, exc, pattern):
    b = to_device(bytes(range(16)))
    raises(exc, pattern, lambda: call(b))
    # The buffer is intact and the resource still allocates and frees.
    assert b.size == 16 and b.tobytes() == bytes(range(16))
    c = DeviceBuffer(size=16)
    c.copy_from_device(b)
    assert c.tobytes() == bytes(range(16))


# ----------------------------------------------------------------------------- per-device API


@pytest.mark.parametrize(
    "device, exc, pattern",
    [
        ("0", TypeError, r"'str' object cannot be interpreted as an integer"),
        (1.5, TypeError, r"'float' object cannot be interpreted as an integer"),
        (None, TypeError, r"'NoneType' object cannot be interpreted as an integer"),
        (-1, ValueError, r"-1"),
        (2**40, ValueError, r"1099511627776"),
    ],
    ids=["str", "float", "none", "negative", "2**40"],
)
def test_get_per_device_resource_bad_ordinal(device, exc, pattern):
    raises(exc, pattern, lambda: mr.get_per_device_resource(device))
    raises(exc, pattern, lambda: mr.get_per_device_resource_type(device))


@pytest.mark.parametrize(
    "device, resource, exc, pattern",
    [
        ("0", "sim", TypeError, r"'str' object cannot be interpreted as an integer"),
        (1.5, "sim", TypeError, r"'float' object cannot be interpreted as an integer"),
        (0, None, TypeError, r"mr must be a DeviceMemoryResource"),
        (0, 5, TypeError, r"mr must be a DeviceMemoryResource"),
    ],
    ids=["str-ordinal", "float-ordinal", "none-mr", "int-mr"],
)
def test_set_per_device_resource_bad_arguments(sim, device, resource, exc, pattern):
    mr.set_per_device_resource(0, sim)
    try:
        value = sim if resource == "sim" else resource
        raises(exc, pattern, lambda: mr.set_per_device_resource(device, value))
        if value is not sim:
            raises(exc, pattern, lambda: mr.set_current_device_resource(value))
        # The table is unchanged.
        assert mr.get_per_device_resource(0) is sim
    finally:
        _rrmm._clear_per_device_resources()


# ----------------------------------------------------------------------------------- logging


@pytest.mark.parametrize(
    "name, exc, pattern",
    [
        ("/nonexistent/dir/x.csv", OSError, r"/nonexistent/dir/x\.dev0\.csv"),
        ("/proc/rrmm-x.csv", OSError, r"/proc/rrmm-x\.dev0\.csv"),
        (5, TypeError, r"log_file_name"),
        ("", ValueError, r"log_file_name"),
    ],
    ids=["missing-dir", "unwritable", "int-name", "empty-name"],
)
def test_logging_adaptor_bad_file_name(sim, name, exc, pattern):
    before = counters(sim)
    raises(exc, pattern, lambda: mr.LoggingResourceAdaptor(sim, name))
    assert_still_works(sim, before)


def test_logging_adaptor_without_name_or_env(sim, monkeypatch):
    monkeypatch.delenv("RMM_LOG_FILE", raising=False)
    raises(ValueError, r"RMM_LOG_FILE is unset", lambda: mr.LoggingResourceAdaptor(sim))


def test_enable_logging_unwritable_path_keeps_resource(sim):
    mr.set_current_device_resource(sim)
    try:
        raises(
            OSError,
            r"/nonexistent/dir/x\.dev0\.csv",
            lambda: mr.enable_logging("/nonexistent/dir/x.csv"),
        )
        # The current resource is not wrapped and still works.
        assert mr.get_current_device_resource() is sim
        assert mr.get_log_filenames() == {0: None}
        assert_still_works(sim, counters(sim))
    finally:
        _rrmm._clear_per_device_resources()


# -------------------------------------------------------------------------------- statistics


def test_statistics_pop_on_last_level(sim):
    st = mr.StatisticsResourceAdaptor(sim)
    a = st.allocate(1000)
    before = counters(st)
    raises(IndexError, r"cannot pop the last counter pair", st.pop_counters)
    assert counters(st) == before
    st.push_counters()
    st.pop_counters()
    raises(IndexError, r"cannot pop the last counter pair", st.pop_counters)
    st.deallocate(a, 1000)
    assert st.allocation_counts.current_bytes == 0


@pytest.mark.parametrize(
    "call, exc, pattern",
    [
        (lambda st: st.allocate("x"), TypeError, r"'str' object cannot be interpreted"),
        (lambda st: st.allocate(1.0), TypeError, r"'float' object cannot be interpreted"),
        (lambda st: st.deallocate(None, 8), TypeError, r"'NoneType' object cannot be interpreted"),
        (lambda st: st.deallocate(0x1000, -8), OverflowError, r"negative"),
    ],
    ids=["allocate-str", "allocate-float", "deallocate-none", "deallocate-negative-size"],
)
def test_statistics_bad_types(sim, call, exc, pattern):
    st = mr.StatisticsResourceAdaptor(sim)
    before = counters(st)
    raises(exc, pattern, lambda: call(st))
    assert_still_works(st, before)
    assert st.allocation_counts.total_count == 2


def test_pop_statistics_on_last_level(sim):
    mr.set_current_device_resource(sim)
    try:
        rrmm.statistics.enable_statistics()
        st = mr.get_current_device_resource()
        raises(IndexError, r"cannot pop the last counter pair", rrmm.statistics.pop_statistics)
        with rrmm.statistics.statistics():
            buf = DeviceBuffer(size=1000)
            assert rrmm.statistics.get_statistics().current_bytes == 1000
            del buf
        assert st.allocation_counts.current_bytes == 0
        assert st.allocation_counts.total_count == 1
    finally:
        _rrmm._clear_per_device_resources()


# ---------------------------------------------------------------------------- replay parser

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"

REPLAY_LINES = [
    ("fields", "1,t,allocate,0x200,10\n", 2, r"expected 6 comma-separated fields"),
    ("action", "1,t,reallocate,0x200,10,0\n", 2, r'unknown action "reallocate"'),
    ("negative-size", "1,t,allocate,0x200,-10,0\n", 2, r'malformed size "-10"'),
    ("huge-size", f"1,t,allocate,0x200,{2**70},0\n", 2, r"malformed size"),
    ("huge-pointer", f"1,t,allocate,0x{'f' * 20},10,0\n", 2, r"malformed pointer"),
    ("nul-byte", "1,t,allocate,0x200,1\x000,0\n", 2, r"malformed size"),
    ("stream", "1,t,allocate,0x200,10,zz\n", 2, r'malformed stream "zz"'),
    ("thread", "x,t,allocate,0x200,10,0\n", 2, r"malformed thread"),
    ("double-allocate", "1,t,allocate,0x200,10,0\n1,t,allocate,0x200,10,0\n", 3, r"already allocated"),
    ("free-wrong-size", "1,t,allocate,0x200,10,0\n1,t,free,0x200,20,0\n", 3, r"with size 20, allocated with size 10"),
    ("free-never-allocated", "1,t,free,0x300,10,0\n", 2, r"never allocated"),
    ("double-free", "1,t,allocate,0x100,10,0\n1,t,free,0x100,10,0\n1,t,free,0x100,10,0\n", 4, r"free of pointer 0x100"),
]  # fmt: skip


def _replay(path: str, **kwargs: Any) -> list[dict[str, Any]]:
    kwargs.setdefault("simulate", GiB)
    return _rrmm.replay_logs([path], kwargs.pop("resources", ["pool"]), **kwargs)


def _good_log(tmp_path: Path) -> str:
    path = tmp_path / "good.csv"
    path.write_text(HEADER + "1,t,allocate,0x100,1000,0\n1,t,free,0x100,1000,0\n")
    return str(path)


@pytest.mark.parametrize(
    "body, line, pattern", [c[1:] for c in REPLAY_LINES], ids=[c[0] for c in REPLAY_LINES]
)
def test_replay_malformed_line(tmp_path, body, line, pattern):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + body)
    raises(ValueError, re.escape(f"{path}:{line}: ") + ".*" + pattern, lambda: _replay(str(path)))
    # Leniently the line is counted and skipped; a good log still replays.
    report = _replay(str(path), lenient=True)[0]
    assert report["parse_warnings"] >= 1
    assert f"{path}:{line}: " in report["warning_messages"][0]
    good = _replay(_good_log(tmp_path))[0]
    assert good["events"] == 2 and good["leaked_allocations"] == 0


@pytest.mark.parametrize(
    "content, exc, pattern",
    [
        (b"\xff\xfe\x00garbage", ValueError, r":1: line is not valid UTF-8"),
        (b"hello,world\n", ValueError, r":1: not an RMM log"),
        (b"", ValueError, r"empty log"),
    ],
    ids=["binary", "not-a-log", "empty"],
)
def test_replay_not_a_log(tmp_path, content, exc, pattern):
    path = tmp_path / "x.csv"
    path.write_bytes(content)
    raises(exc, pattern, lambda: _replay(str(path)))


def test_replay_corrupt_gzip_and_missing_files(tmp_path):
    bad_gz = tmp_path / "bad.csv.gz"
    bad_gz.write_bytes(gzip.compress((HEADER + "1,t,allocate,0x1,8,0\n").encode())[:30])
    raises(OSError, re.escape(str(bad_gz)), lambda: _replay(str(bad_gz)))
    raises(OSError, r"missing\.csv: No such file", lambda: _replay(str(tmp_path / "missing.csv")))
    raises(OSError, r"Is a directory", lambda: _replay(str(tmp_path)))
    assert _replay(_good_log(tmp_path))[0]["events"] == 2


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        ({"resources": ["nope"]}, ValueError, r'unknown resource "nope"'),
        ({"simulate": -1}, OverflowError, r"negative"),
        ({"resources": "pool"}, TypeError, r"Can't extract `str` to `Vec`"),
    ],
    ids=["unknown-resource", "negative-simulate", "resources-str"],
)
def test_replay_bad_arguments(tmp_path, kwargs, exc, pattern):
    good = _good_log(tmp_path)
    raises(exc, pattern, lambda: _replay(good, **kwargs))
    assert _replay(good)[0]["events"] == 2


def test_replay_unbuildable_resource_is_its_own_row(tmp_path):
    """A pool the device cannot hold: that resource's row carries the reason, the others
    replay. An option no pool could be built with is refused at the call (issue 50)."""
    good = _good_log(tmp_path)
    rows = _replay(good, resources=["pool", "simulated"], initial_pool_size=2 * GiB)
    by_name = {r["resource"]: r for r in rows}
    assert "failed to allocate 2147483648 bytes" in by_name["pool"]["error"]
    assert by_name["simulated"]["events"] == 2
    raises(RuntimeError, r"multiple of 256 bytes \(initial_pool_size=1000: use 768 or 1024\)",
           lambda: _replay(good, resources=["pool", "simulated"], initial_pool_size=1000))


# ------------------------------------------------------------ GIL and Python callbacks


# The child scripts' common part: `cb`, a CallbackMemoryResource over simulated memory whose
# allocations give the GIL away, and `race(*rounds)`, which runs each round in a loop on its own
# thread for 2 s and checks that every thread got through at least once.
_RACE = """
sim = mr.SimulatedMemoryResource("1TiB")
def grow(n, s):
    time.sleep(0.002)  # gives the GIL to the other thread
    return sim.allocate(n)
cb = mr.CallbackMemoryResource(grow, lambda p, n, s: sim.deallocate(p, n))
def race(*rounds):
    stop = time.monotonic() + 2
    counts = [0] * len(rounds)
    def work(i):
        while time.monotonic() < stop:
            rounds[i]()
            counts[i] += 1
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(rounds))]
    for t in threads: t.start()
    for t in threads: t.join()
    assert min(counts) > 0, counts
"""


def test_no_deadlock_pool_growth_over_callback(child):
    """Two threads allocate from a pool over a CallbackMemoryResource: each growth runs Python
    code under the pool's lock, and CPython hands the GIL to the other thread meanwhile (here
    for certain: the callback sleeps). A thread that waits for the pool's lock while holding the
    GIL would block the callback for ever: calls into a chain that reaches Python must release
    the GIL (the callback takes it back)."""
    child(
        _RACE
        + """
pool = mr.PoolMemoryResource(cb, 1 << 20)
def grow_pool():
    pool.allocate(64 << 20)  # never freed: every call grows the pool through the callback
race(grow_pool, grow_pool)
print("CHILD OK")
""",
        timeout=30,
    )


def test_no_deadlock_hook_allocations_over_callback(child):
    """The framework hooks' entry point (`hook_allocate`, CuPy/Numba) from two threads, with a
    pool over a CallbackMemoryResource as the device's resource: same rule as the methods."""
    child(
        _RACE
        + """
mr.set_per_device_resource(0, mr.PoolMemoryResource(cb, 1 << 20))
keep = []
def hook_allocate():
    keep.append(_rrmm.hook_allocate(64 << 20, 0, 0))  # grows the pool every time
race(hook_allocate, hook_allocate)
print("CHILD OK")
""",
        timeout=30,
    )


@pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
def test_no_deadlock_release_over_callback(child):
    """Thread A holds the GIL and calls into the pool while thread B calls release(), whose
    upstream frees run Python code."""
    child(
        _RACE
        + """
plain = mr.CallbackMemoryResource(lambda n, s: sim.allocate(n), lambda p, n, s: sim.deallocate(p, n))
pool = mr.PoolMemoryResource(plain, 1 << 20)
def release_round():
    ptrs = [pool.allocate(8 << 20) for _ in range(8)]
    for p in ptrs:
        pool.deallocate(p, 8 << 20)
    pool.release()
def allocate_round():
    p = pool.allocate(64 << 20)
    pool.deallocate(p, 64 << 20)
race(release_round, allocate_round)
print("CHILD OK")
""",
        timeout=30,
    )


class CallbackError(Exception):
    pass


def test_failure_callback_exception_raised_exactly(sim):
    raised = CallbackError("from the failure callback")

    def callback(nbytes: int) -> bool:
        raise raised

    fc = mr.FailureCallbackResourceAdaptor(mr.LimitingResourceAdaptor(sim, MiB), callback)
    # As RMM: a RuntimeError with the callback's message, the very exception as its cause.
    error = raises(RuntimeError, r"^from the failure callback$", lambda: fc.allocate(2 * MiB))
    assert error.__cause__ is raised
    assert_still_works(fc, counters(fc))


def test_stale_callback_exception_is_not_raised_later(sim):
    """The pool's growth fails through the failure callback (which raises), the pool frees a
    grown chunk and retries with success: the exception must not surface on a later, unrelated
    out-of-memory error."""

    def callback(nbytes: int) -> bool:
        raise CallbackError("stale")

    fc = mr.FailureCallbackResourceAdaptor(mr.LimitingResourceAdaptor(sim, 4 * MiB), callback)
    pool = mr.PoolMemoryResource(fc, MiB)
    a = pool.allocate(2 * MiB)
    pool.deallocate(a, 2 * MiB)
    try:
        b = pool.allocate(3 * MiB)
        pool.deallocate(b, 3 * MiB)
    except RuntimeError as e:
        assert isinstance(e.__cause__, CallbackError)  # raised at once is right too
    raises(
        MemoryError,
        r"simulated device of 0 bytes",
        lambda: mr.SimulatedMemoryResource(0).allocate(256),
    )
    # This request's own failure runs the callback again, which raises again: that exception
    # (RMM's RuntimeError, the callback's as its cause) is this call's, not a stale one.
    raises(RuntimeError, r"stale", lambda: fc.allocate(GiB))


def test_callback_resource_exception_raised_exactly(sim):
    raised = CallbackError("from allocate_func")

    def allocate(nbytes: int, stream: Any) -> int:
        raise raised

    cb = mr.CallbackMemoryResource(allocate, lambda p, n, s: None)
    error = raises(RuntimeError, r"^from allocate_func$", lambda: cb.allocate(16))
    assert error.__cause__ is raised
    raises(
        MemoryError,
        r"simulated device of 0 bytes",
        lambda: mr.SimulatedMemoryResource(0).allocate(256),
    )


@pytest.mark.parametrize(
    "ret, cause, pattern",
    [
        ("x", TypeError, r"'str' object cannot be interpreted as an integer"),
        (-1, OverflowError, r"negative"),
        (None, TypeError, r"'NoneType' object cannot be interpreted as an integer"),
    ],
    ids=["str", "negative", "none"],
)
def test_callback_resource_bad_return(ret, cause, pattern):
    sim = mr.SimulatedMemoryResource("1MiB")
    cb = mr.CallbackMemoryResource(lambda n, s: ret, lambda p, n, s: None)
    # As RMM: a RuntimeError, the conversion's error as its cause.
    error = raises(RuntimeError, pattern, lambda: cb.allocate(16))
    assert type(error.__cause__) is cause
    # A later, unrelated out-of-memory error is a plain MemoryError.
    raises(MemoryError, r"failed to allocate", lambda: sim.allocate(GiB))


# ------------------------------------------------- no panic across C entry points or destructors

_BROKEN_STDERR = """
import ctypes, os
sim = mr.SimulatedMemoryResource(1 << 30)
mr.set_per_device_resource(0, sim)
# Standard error becomes a pipe nobody reads: every write to it fails with EPIPE (Python
# ignores SIGPIPE), as when the reader of a pipeline has gone.
r, w = os.pipe()
os.close(r)
os.dup2(w, 2)
"""


def test_torch_free_failure_with_broken_stderr_does_not_abort(child):
    child(
        _BROKEN_STDERR
        + """
alloc, free = _rrmm.torch_allocator_addresses()
c_free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(free)
c_free(0x1000, 64, 0, None)  # a pointer the resource never handed out: reported, not raised
p = sim.allocate(256)
sim.deallocate(p, 256)
print("CHILD OK")
"""
    )


def test_hook_allocation_drop_failure_with_broken_stderr_does_not_abort(child):
    child(
        _BROKEN_STDERR
        + """
h = _rrmm.hook_allocate(256, 0, 0)
sim.deallocate(h.ptr, 256)  # freed behind the owner's back: its own free fails on drop
del h
assert sim.live_allocations() == 0
print("CHILD OK")
"""
    )


@pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
@pytest.mark.parametrize(
    "make",
    [
        mr.CudaMemoryResource,
        mr.ManagedMemoryResource,
        mr.PinnedHostMemoryResource,
        mr.CudaAsyncMemoryResource,
    ],
    ids=lambda c: c.__name__,
)
def test_cuda_source_resources_check_frees_from_python(make):
    """Driven from Python, the CUDA source resources keep a live-pointer map: a bogus, double or
    wrong-size free is a RuntimeError and never reaches the driver."""
    r = make()
    raises(RuntimeError, FREE_PATTERN, lambda: r.deallocate(0x1000, 8))
    a = r.allocate(1000)
    raises(RuntimeError, r"size", lambda: r.deallocate(a, 4096))
    r.deallocate(a, 1000)
    raises(RuntimeError, hex(a), lambda: r.deallocate(a, 1000))
    b, c = r.allocate(1000), r.allocate(1000)
    assert b != c
    r.deallocate(b, 1000)
    r.deallocate(c, 1000)
