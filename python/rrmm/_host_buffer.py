"""``rrmm.HostBuffer``: host memory from a host resource (pinned by default), that numpy, CuPy
and PyTorch use without a copy, and that device buffers copy to and from on a stream without
waiting.

The buffer protocol: a ``HostBuffer`` is itself a writable buffer on every supported Python
(3.11 and later: ``memoryview(hb)``, ``numpy.frombuffer(hb)``, ``torch.frombuffer(hb)``; its
base class ``_rrmm._HostBytes`` fills the buffer slot of the 3.11 stable ABI); ``hb.view()`` is
the same ``memoryview`` and ``numpy.asarray(hb)`` uses its ``__array_interface__``. Each view
keeps the buffer alive.

Asynchronous copies (``copy_from_device``, ``copy_to_device``, and ``DeviceBuffer.copy_to_host``
/ ``copy_from_host`` given a ``HostBuffer``) are queued on a stream and not waited for; the
buffer remembers the stream, and every host-side access through the buffer (``view()``, the
buffer protocol, ``__array_interface__``, ``tobytes()``) and its free wait for it first. An
array made from the buffer earlier does not wait: call ``hb.synchronize()`` before reading it.
"""

from __future__ import annotations

import weakref
from typing import Any

from rrmm import _rrmm

__all__ = ["HostBuffer", "get_current_host_resource", "set_current_host_resource"]

#: The kinds of memory the host can read and write (``DeviceMemoryResource._rrmm_kind``).
_HOST_KINDS = ("pinned_host", "host")


def _shown(value: Any) -> str:
    """``value`` in an error message: its type and a short repr (any object, even one whose
    ``__repr__`` fails)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message must not fail on the value it names
        text = object.__repr__(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _check_host_resource(resource: Any, caller: str) -> None:
    """Refuses ``resource`` for ``caller``: a TypeError unless it is a memory resource, a
    ValueError unless the host can read its memory, each naming the value given."""
    if not isinstance(resource, _rrmm.DeviceMemoryResource):
        raise TypeError(f"{caller}: expected a memory resource (pinned or system host memory) "
                        f"or None, got {_shown(resource)}")
    if resource._rrmm_kind not in _HOST_KINDS:
        raise ValueError(
            f"{caller}: {type(resource).__name__} hands out {resource._rrmm_kind} memory, "
            "which the host cannot read; use a pinned or system (host) resource"
        )


def _buffer_size(size: Any) -> int:
    """A HostBuffer's ``size``, read by the package's one size reader (as every other size):
    bytes (an int or anything with ``__index__`` but a bool) or a size string such as
    ``"1MiB"``, in [0, 2**64); TypeError or ValueError (a negative size or one past 2**64 - 1
    too) naming ``size`` and the value otherwise."""
    if isinstance(size, bool):
        raise TypeError(f"HostBuffer: size must be a whole number of bytes or a size string "
                        f"such as \"1MiB\", got {_shown(size)}")
    try:
        return int(_rrmm._read_size(size, "HostBuffer: size"))
    except OverflowError as error:
        raise ValueError(str(error)) from None


def get_current_host_resource() -> Any:
    """The process-wide host resource (``HostBuffer``'s default, CuPy's pinned allocator hook):
    the one set with ``set_current_host_resource``, else a ``PinnedHostMemoryResource`` made on
    first use (a ``SystemMemoryResource`` where no CUDA driver is available). The Rust core owns
    it (the same one its CuPy hook uses); this asks it for its object."""
    return _rrmm._current_host_resource()


def set_current_host_resource(resource: Any) -> None:
    """Sets the process-wide host resource: any resource whose memory the host can read and
    write (``PinnedHostMemoryResource``, a pool over it, the ``pinned_expandable`` stack,
    ``SystemMemoryResource``); ``None`` goes back to the default."""
    if resource is not None:
        _check_host_resource(resource, "set_current_host_resource")
    _rrmm._set_current_host_resource(resource)


def _free(mr: Any, ptr: int, size: int, stream: list[Any]) -> None:
    if stream[0] is not None:
        stream[0].synchronize()
    mr.deallocate(ptr, size)


class HostBuffer(_rrmm._HostBytes):
    """``size`` bytes (an int, or a size string such as ``"1MiB"`` as every size of rrmm) of
    host memory from ``mr`` (default: the current host resource, pinned), uninitialized; freed
    when the buffer and every view of it are gone."""

    __slots__ = ("__weakref__", "_finalizer", "_mr", "_ptr", "_size", "_stream")
    #: ``DeviceBuffer.copy_to_host`` / ``copy_from_host`` queue their copies through it.
    __rrmm_host_buffer__ = True

    def __init__(self, size: int | str = 0, mr: Any = None) -> None:
        size = _buffer_size(size)
        if mr is None:
            mr = get_current_host_resource()
        _check_host_resource(mr, "HostBuffer: mr")
        ptr = mr.allocate(size) if size else 0
        self._set_bytes(ptr, size)
        self._ptr = ptr
        self._size = size
        self._mr = mr
        # The stream of the last queued copy (a one-element list, shared with the finalizer).
        self._stream: list[Any] = [None]
        self._finalizer = weakref.finalize(self, _free, mr, ptr, size, self._stream)

    @property
    def ptr(self) -> int:
        """The address of the first byte (0 for an empty buffer)."""
        return self._ptr

    @property
    def size(self) -> int:
        """Bytes."""
        return self._size

    nbytes = size

    @property
    def mr(self) -> Any:
        """The resource it came from."""
        return self._mr

    @property
    def is_pinned(self) -> bool:
        """Whether the memory is pinned (page-locked and known to CUDA)."""
        return self._mr._rrmm_kind == "pinned_host"

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        kind = "pinned" if self.is_pinned else "pageable"
        return f"<rrmm.HostBuffer size={self._size} ptr={self._ptr:#x} {kind}>"

    def synchronize(self) -> None:
        """Waits for the copies queued on the buffer's last stream."""
        stream = self._stream[0]
        if stream is not None:
            stream.synchronize()
            self._stream[0] = None

    def view(self) -> memoryview:
        """A writable ``memoryview`` of the bytes (format ``B``) that keeps the buffer alive;
        waits for queued copies first."""
        exporter: Any = self  # the buffer slot of its base class (no __buffer__ before 3.12)
        return memoryview(exporter)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface: a writable 1-D ``uint8`` array over the bytes (numpy keeps
        the buffer alive); waits for queued copies first."""
        self.synchronize()
        return {
            "shape": (self._size,),
            "typestr": "|u1",
            "data": (self._ptr, False),
            "version": 3,
        }

    def tobytes(self) -> bytes:
        """A copy of the bytes; waits for queued copies first."""
        return bytes(self.view())

    def _queue(self, stream: Any) -> None:
        if not _rrmm.driver_available():
            return  # without a driver, copies happen at once
        previous = self._stream[0]
        if previous is not None and previous is not stream:
            previous.synchronize()
        self._stream[0] = stream

    def copy_from_device(self, buf: Any, stream: Any = None) -> HostBuffer:
        """Queues a copy of device buffer ``buf`` (a ``DeviceBuffer``, at most ``size`` bytes)
        into the start of this buffer on ``stream`` (default: ``buf``'s stream) and returns at
        once; returns ``self``."""
        return self._copy(buf, stream, to_device=False, caller="copy_from_device")

    def copy_to_device(self, buf: Any, stream: Any = None) -> HostBuffer:
        """Queues a copy of this buffer's bytes (at most ``buf.size``) into the start of device
        buffer ``buf`` on ``stream`` (default: ``buf``'s stream) and returns at once; returns
        ``self``."""
        return self._copy(buf, stream, to_device=True, caller="copy_to_device")

    def _copy(self, buf: Any, stream: Any, to_device: bool, caller: str) -> HostBuffer:
        stream = _stream_of(buf, stream, f"HostBuffer.{caller}")
        source, dest = (self._size, buf.size) if to_device else (buf.size, self._size)
        if source > dest:
            where = "DeviceBuffer" if to_device else "HostBuffer"
            raise ValueError(f"HostBuffer: a copy of {source} bytes does not fit a {where} "
                             f"of {dest}")
        self._queue(stream)
        _rrmm._copy_host_async(buf, self._ptr, source, to_device, stream)
        return self


def _stream_of(buf: Any, stream: Any, caller: str) -> Any:
    """The stream of a copy between a HostBuffer and ``buf`` (``stream``, else ``buf``'s);
    TypeError naming the argument and the value for a ``buf`` that is not a DeviceBuffer or a
    ``stream`` that is not one."""
    if not isinstance(buf, _rrmm.DeviceBuffer):
        raise TypeError(f"{caller}: buf must be an rrmm.DeviceBuffer, got {_shown(buf)}")
    if stream is None:
        return buf.stream
    from rrmm.pylibrmm.stream import Stream

    if isinstance(stream, Stream):
        return stream
    try:
        return Stream(stream)
    except TypeError as error:
        raise TypeError(f"{caller}: stream {_shown(stream)} is not a stream: {error}") from None
    except ValueError as error:
        raise ValueError(f"{caller}: stream {_shown(stream)}: {error}") from None
