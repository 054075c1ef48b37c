"""Stream wrapping, constants, equality, and the stream pool without a GPU."""

from __future__ import annotations

import pytest
import rrmm
from rrmm import _rrmm
from rrmm.pylibrmm.stream import (
    DEFAULT_STREAM,
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    CudaStreamFlags,
    Stream,
)


def test_constants():
    assert DEFAULT_STREAM.__cuda_stream__() == (0, 0)
    assert LEGACY_DEFAULT_STREAM.__cuda_stream__() == (0, 1)
    assert PER_THREAD_DEFAULT_STREAM.__cuda_stream__() == (0, 2)
    assert DEFAULT_STREAM.is_default()
    assert LEGACY_DEFAULT_STREAM.is_default()
    assert DEFAULT_STREAM != LEGACY_DEFAULT_STREAM
    assert rrmm.pylibrmm.Stream is Stream
    assert int(CudaStreamFlags.SYNC_DEFAULT) == 0 and int(CudaStreamFlags.NON_BLOCKING) == 1


def test_wrap_rrmm_stream():
    s = Stream(PER_THREAD_DEFAULT_STREAM)
    assert s == PER_THREAD_DEFAULT_STREAM
    assert hash(s) == hash(PER_THREAD_DEFAULT_STREAM)
    assert len({s, PER_THREAD_DEFAULT_STREAM, DEFAULT_STREAM}) == 2


class ProtocolStream:
    def __init__(self, handle, version=0):
        self.handle_value = handle
        self.version = version

    def __cuda_stream__(self):
        return (self.version, self.handle_value)


class CupyLikeStream:
    def __init__(self, ptr):
        self.ptr = ptr


class NumbaLikeHandle:
    def __init__(self, value):
        self.value = value


class NumbaLikeStream:
    def __init__(self, handle):
        self.handle = NumbaLikeHandle(handle)


class TorchLikeStream:
    def __init__(self, handle):
        self.cuda_stream = handle


@pytest.mark.parametrize(
    "obj",
    [
        ProtocolStream(0x1234),
        CupyLikeStream(0x1234),
        NumbaLikeStream(0x1234),
        TorchLikeStream(0x1234),
    ],
)
def test_foreign_streams(obj):
    s = Stream(obj)
    assert s.__cuda_stream__() == (0, 0x1234)
    assert not s.is_default()
    assert s == Stream(ProtocolStream(0x1234))


def test_numba_null_handle_is_default():
    assert Stream(NumbaLikeStream(None)) == DEFAULT_STREAM


def test_protocol_version():
    with pytest.raises(NotImplementedError):
        Stream(ProtocolStream(5, version=1))


def test_bad_objects():
    with pytest.raises(TypeError):
        Stream(42)
    with pytest.raises(TypeError):
        Stream("stream")
    with pytest.raises(ValueError):
        Stream(DEFAULT_STREAM, flags=CudaStreamFlags.NON_BLOCKING)


def test_foreign_stream_as_argument(system_mr):
    b = rrmm.DeviceBuffer(size=4, stream=Stream(LEGACY_DEFAULT_STREAM))
    assert b.stream == LEGACY_DEFAULT_STREAM
    b2 = rrmm.DeviceBuffer(size=4, stream=ProtocolStream(1))
    assert b2.stream == LEGACY_DEFAULT_STREAM


@pytest.mark.skipif(_rrmm.driver_available(), reason="checks the no-driver error")
def test_new_stream_without_driver():
    with pytest.raises(RuntimeError, match="driver"):
        Stream()
    with pytest.raises(RuntimeError):
        rrmm.pylibrmm.CudaStreamPool(2)


def test_stream_pool_arguments():
    with pytest.raises(ValueError):
        rrmm.pylibrmm.CudaStreamPool(0)
    with pytest.raises(TypeError):
        rrmm.pylibrmm.CudaStreamPool(1.5)
