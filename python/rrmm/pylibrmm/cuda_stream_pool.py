"""A pool of streams handed out round robin (RMM's ``rmm.pylibrmm.cuda_stream_pool``)."""

from __future__ import annotations

import itertools
import threading

from rrmm.pylibrmm.stream import CudaStreamFlags, Stream

__all__ = ["CudaStreamPool"]


class CudaStreamPool:
    """``pool_size`` streams made with ``flags``; ``get_stream()`` hands them out in turn."""

    def __init__(
        self, pool_size: int = 16, flags: CudaStreamFlags = CudaStreamFlags.SYNC_DEFAULT
    ) -> None:
        if not isinstance(pool_size, int) or isinstance(pool_size, bool):
            raise TypeError("pool_size must be an int")
        if pool_size <= 0:
            raise ValueError("Stream pool size must be greater than zero")
        self._streams = [Stream(flags=int(flags)) for _ in range(pool_size)]
        self._next = itertools.count()
        self._lock = threading.Lock()

    def get_stream(self, stream_id: int | None = None) -> Stream:
        """The stream ``stream_id`` (modulo the pool size), or the next one in turn."""
        if stream_id is None:
            with self._lock:
                stream_id = next(self._next)
        return self._streams[stream_id % len(self._streams)]

    def get_pool_size(self) -> int:
        """The number of streams."""
        return len(self._streams)
