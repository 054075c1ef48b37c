"""CUDA streams (RMM's ``rmm.pylibrmm.stream``)."""

from __future__ import annotations

from enum import IntEnum

from rrmm._rrmm import (
    DEFAULT_STREAM,
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    Stream,
)

__all__ = [
    "DEFAULT_STREAM",
    "LEGACY_DEFAULT_STREAM",
    "PER_THREAD_DEFAULT_STREAM",
    "CudaStreamFlags",
    "Stream",
]


class CudaStreamFlags(IntEnum):
    """Flags of a new stream."""

    SYNC_DEFAULT = 0
    NON_BLOCKING = 1
