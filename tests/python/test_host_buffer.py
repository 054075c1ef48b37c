"""rrmm.HostBuffer on CPU (system memory): the buffer protocol and numpy without a copy, copies
to and from device buffers (queued on a stream with a driver; at once without one) against a
model, the current host resource, and refusals that leave everything working."""

from __future__ import annotations

import sys

import pytest
import rrmm
from hypothesis import given, settings
from hypothesis import strategies as st
from rrmm import mr

np = pytest.importorskip("numpy")


@pytest.fixture
def host_mr():
    return mr.SystemMemoryResource()


def test_views_share_the_memory_and_keep_it_alive(host_mr):
    hb = rrmm.HostBuffer(64, mr=host_mr)
    assert (hb.size, hb.nbytes, len(hb), hb.mr) == (64, 64, 64, host_mr)
    assert not hb.is_pinned
    v = hb.view()
    v[:] = bytes(range(64))
    arr = np.asarray(hb)
    assert arr.dtype == np.uint8 and arr.shape == (64,)
    assert arr.ctypes.data == hb.ptr
    arr[0] = 200
    assert hb.tobytes()[:2] == bytes([200, 1])
    del hb
    # The view and the array hold the buffer: its memory is still there.
    assert v[1] == 1 and arr[0] == 200 and v[0] == 200


def test_it_is_a_buffer_on_every_supported_python(host_mr):
    # Issue 31: on Python 3.11 memoryview(hb) and numpy.frombuffer(hb) raised TypeError (the
    # wheel was on the 3.10 stable ABI, which has no buffer slot, and __buffer__ is 3.12+); the
    # buffer slot of HostBuffer's base class works from 3.11 on.
    assert sys.version_info >= (3, 11)
    hb = rrmm.HostBuffer(16, mr=host_mr)
    view = memoryview(hb)
    assert (view.format, view.itemsize, view.nbytes, view.readonly) == ("B", 1, 16, False)
    view[:4] = b"rrmm"
    assert bytes(memoryview(hb)[:4]) == b"rrmm" and hb.tobytes()[:4] == b"rrmm"
    arr = np.frombuffer(hb, dtype=np.uint8)
    assert arr[:4].tobytes() == b"rrmm" and arr.ctypes.data == hb.ptr
    del hb
    # The views hold the buffer: its memory is still there.
    assert bytes(view[:4]) == b"rrmm" and arr[:4].tobytes() == b"rrmm"
    empty = memoryview(rrmm.HostBuffer(0, mr=host_mr))
    assert empty.nbytes == 0 and bytes(empty) == b""


def test_the_buffer_slot_cannot_be_pointed_elsewhere(host_mr):
    hb = rrmm.HostBuffer(8, mr=host_mr)
    with pytest.raises(ValueError, match="already set"):
        hb._set_bytes(0x1000, 8)


def test_an_empty_buffer(host_mr):
    hb = rrmm.HostBuffer(0, mr=host_mr)
    assert hb.ptr == 0 and hb.tobytes() == b"" and np.asarray(hb).size == 0


def test_bad_arguments_are_clear_errors_and_change_nothing(host_mr):
    with pytest.raises(ValueError, match="negative"):
        rrmm.HostBuffer(-1, mr=host_mr)
    with pytest.raises(TypeError, match="int"):
        rrmm.HostBuffer(1.5, mr=host_mr)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host cannot read"):
        rrmm.HostBuffer(8, mr=mr.SimulatedMemoryResource(1 << 20))
    with pytest.raises(TypeError, match="memory resource"):
        mr.set_current_host_resource(object())
    hb = rrmm.HostBuffer(8, mr=host_mr)
    db = rrmm.DeviceBuffer(size=4, mr=host_mr)
    with pytest.raises(ValueError, match="does not fit"):
        hb.copy_to_device(db)
    with pytest.raises(TypeError, match="DeviceBuffer"):
        hb.copy_from_device(b"1234")
    hb.view()[:] = b"abcdefgh"
    db2 = rrmm.DeviceBuffer(size=8, mr=host_mr)
    db2.copy_from_host(hb)
    assert db2.tobytes() == b"abcdefgh"


def test_the_current_host_resource(host_mr):
    before = mr.get_current_host_resource()
    try:
        mr.set_current_host_resource(host_mr)
        assert mr.get_current_host_resource() is host_mr
        assert rrmm.HostBuffer(8).mr is host_mr
    finally:
        mr.set_current_host_resource(before)
    assert mr.get_current_host_resource() is before


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "to_device", "from_device",
                                           "copy_to_host", "copy_from_host"]),
                          st.integers(0, 3), st.binary(min_size=1, max_size=64)),
                max_size=30))
def test_copies_match_a_model(ops):
    host_mr = mr.SystemMemoryResource()
    size = 64
    hosts = [rrmm.HostBuffer(size, mr=host_mr) for _ in range(2)]
    devices = [rrmm.DeviceBuffer(size=size, mr=host_mr) for _ in range(2)]
    model_h = [bytearray(size) for _ in range(2)]
    model_d = [bytearray(size) for _ in range(2)]
    for hb, m in zip(hosts, model_h):
        hb.view()[:] = bytes(size)
    for db, m in zip(devices, model_d):
        db.copy_from_host(bytes(size))
    for op, i, data in ops:
        h, d = i % 2, i // 2
        if op == "write":
            hosts[h].view()[: len(data)] = data
            model_h[h][: len(data)] = data
        elif op in ("to_device", "copy_from_host"):
            if op == "to_device":
                hosts[h].copy_to_device(devices[d])
            else:
                devices[d].copy_from_host(hosts[h])
            model_d[d][:] = model_h[h]
        else:
            if op == "from_device":
                hosts[h].copy_from_device(devices[d])
            else:
                assert devices[d].copy_to_host(hosts[h]) is hosts[h]
            model_h[h][:] = model_d[d]
        assert hosts[h].tobytes() == bytes(model_h[h])
    for db, m in zip(devices, model_d):
        assert db.tobytes() == bytes(m)


def test_the_pinned_allocator_hook_allocates_from_the_current_host_resource():
    # CuPy's pinned hook (rrmm.allocators.cupy.rmm_cupy_pinned_allocator) wraps this call.
    from rrmm import _rrmm

    stats = mr.StatisticsResourceAdaptor(mr.SystemMemoryResource())
    before = mr.get_current_host_resource()
    try:
        mr.set_current_host_resource(stats)
        alloc = _rrmm.pinned_allocate(4096)
        assert alloc.ptr != 0 and alloc.size == 4096
        assert stats.allocation_counts.current_bytes == 4096
        alloc.free()
        assert stats.allocation_counts.current_bytes == 0
    finally:
        mr.set_current_host_resource(before)
