"""Dask's arrays handed between workers of one device by attaching, not copying (issue 49).

``RRMMSetup(share_arrays=True)`` builds each worker's pool shareable and publishes it (this
module's ``start``) under a name derived from the worker's address, in the ledgers' directory of
its device (its UUID; ``host`` for the CPU stand-in). A worker's ``get_data`` handler is
wrapped (``wrap_get_data``): when the worker asking (``who``) has its publication in the same
directory, i.e. it is on this host and this device, the serialization family ``rrmm-share`` is
tried first. That family names the array's base block in the sender's publication (a fresh name
per send) and sends only the exporter's path, the name, dtype, shape, strides and the offset of
the array in its block; the receiver attaches (one attachment per exporter per process), builds
the array over the mapped block (no copy) and releases the name when the array and every view
of it are gone, so the sender's free of the block, deferred while held, runs then.

Anything else (an object that is no CuPy or NumPy array, an array outside the published pool,
an object dtype, an empty array, a refused name) raises NotImplementedError in the family, so
distributed serializes it with the next family (``cuda``/``dask``/``pickle``) as it would have.

Views and non-contiguous arrays go as they are: the whole base block is named and the receiver
builds the same strides at the same offset over it (the block stays allocated while the
receiver holds any of it). Received NumPy arrays are read-only; received CuPy arrays are
writable (CuPy has no read-only arrays) and writes reach the sender's copy.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import sys
import threading
import uuid
import weakref
from typing import Any

import rrmm.share

__all__ = [
    "FAMILY",
    "deserialize",
    "publication_name",
    "register",
    "serialize",
    "serializers_for",
    "start",
    "stop",
    "wrap_get_data",
]

#: The serialization family's name in distributed's registry.
FAMILY = "rrmm-share"

_log = logging.getLogger("rrmm.dask")
#: Where a fallback to copying is logged: debug, or warning with ``RRMM_DASK_SHARE_VERBOSE=1``.
_FALLBACK_LEVEL = logging.WARNING if os.environ.get("RRMM_DASK_SHARE_VERBOSE") else logging.DEBUG
_lock = threading.Lock()
#: This process's publication (a sender's) and the device of its pool (None: host memory).
_publication: Any = None
_device: int | None = None
#: Attachments of this process (a receiver's), one per exporter's path.
_attachments: dict[str, rrmm.share.Attachment] = {}


def publication_name(address: str) -> str:
    """The publication name of the worker at ``address`` (30 characters at most)."""
    return "dask-" + hashlib.sha256(address.encode()).hexdigest()[:24]


def start(pool: Any, address: str, device: int | None) -> Any:
    """Publishes ``pool`` (shareable) as the worker at ``address``'s, on ``device`` (None: a
    host pool); its arrays may go by name from now on. Returns the publication."""
    global _publication, _device
    pub = pool.publish(publication_name(address))
    with _lock:
        old, _publication, _device = _publication, pub, device
    if old is not None:
        old.close()
    return pub


def stop() -> None:
    """Stops publishing (importers keep what they hold) and closes this process's
    attachments."""
    global _publication
    with _lock:
        pub, _publication = _publication, None
        attachments = list(_attachments.values())
        _attachments.clear()
    if pub is not None:
        pub.close()
    for attachment in attachments:
        attachment.close()


def _peer_on_this_device(address: str | None) -> bool:
    """Whether the worker at ``address`` published a pool where this one's peers on the same
    host and device do: the socket path made the same way as this publication's (in the
    ledgers' directory of the device, or, where that path is too long for a socket, in the
    short directory it falls back to)."""
    pub = _publication
    if pub is None or not address:
        return False
    peer = rrmm.share.path_of(publication_name(address), device=_device)
    return peer != pub.path and os.path.exists(peer)


def serializers_for(who: str | None, serializers: Any) -> Any:
    """The serializers a ``get_data`` for ``who`` uses: ``rrmm-share`` first when ``who`` is on
    this device, else ``serializers`` unchanged."""
    if not _peer_on_this_device(who):
        if who is not None:
            _log.log(_FALLBACK_LEVEL, "rrmm: %s publishes no pool on this device: copied", who)
        return serializers
    rest = [s for s in (serializers or ("dask", "pickle")) if s != FAMILY]
    return [FAMILY, *rest]


def before_get_data(worker: Any, marker: str, before: Any) -> None:
    """Runs ``before(kwargs)`` ahead of each call of ``worker``'s ``get_data`` handler (once
    per ``marker``: wrapping again does nothing). ``before`` may change the call's keywords.
    rrmm's worker plumbing wraps the handler through this one function."""
    handlers = getattr(worker, "handlers", None)
    if not isinstance(handlers, dict) or "get_data" not in handlers:
        return
    original = handlers["get_data"]
    if getattr(original, marker, False):
        return

    @functools.wraps(original)
    async def get_data(*args: Any, **kwargs: Any) -> Any:
        before(kwargs)
        result = original(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    setattr(get_data, marker, True)
    handlers["get_data"] = get_data


def _share_first(kwargs: dict[str, Any]) -> None:
    kwargs["serializers"] = serializers_for(kwargs.get("who"), kwargs.get("serializers"))


def wrap_get_data(worker: Any) -> None:
    """Makes ``worker``'s ``get_data`` try ``rrmm-share`` first for workers on this device, and
    lets its own requests be answered with it (its deserializers, where it lists them)."""
    before_get_data(worker, "_rrmm_shares", _share_first)
    rpc = getattr(worker, "rpc", None)
    names = getattr(rpc, "deserializers", None)
    if names is not None and FAMILY not in names:
        rpc.deserializers = [FAMILY, *names]  # type: ignore[union-attr]


# ---------------------------------------------------------------- the family


def _block_of(x: Any) -> tuple[str, int, int, int] | None:
    """``(kind, base block's address, its bytes, the array's offset in it)`` of a CuPy or NumPy
    array, None for anything else."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        mem = x.data.mem
        return "cupy", int(mem.ptr), int(mem.size), int(x.data.ptr) - int(mem.ptr)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(x, numpy.ndarray):
        root = x
        while isinstance(root.base, numpy.ndarray):
            root = root.base
        base = int(root.__array_interface__["data"][0])
        start = int(x.__array_interface__["data"][0])
        return "numpy", base, int(root.nbytes), start - base
    return None


def serialize(x: Any) -> tuple[dict[str, Any], list[Any]]:
    """The sender's half: names ``x``'s base block in this process's publication and returns
    a header that says where; NotImplementedError (the next family) where it cannot."""
    pub = _publication
    if pub is None:
        raise NotImplementedError("no publication in this process")
    found = _block_of(x)
    _log.log(_FALLBACK_LEVEL, "rrmm: serializing %s (%s)", type(x).__name__, found)
    if found is None:
        raise NotImplementedError(f"{type(x).__name__} is no CuPy or NumPy array")
    kind, base, nbytes, offset = found
    if x.nbytes == 0 or x.dtype.hasobject or x.dtype.fields is not None:
        raise NotImplementedError("empty, object or structured arrays are copied")
    name = uuid.uuid4().hex
    try:
        pub.share(name, base, nbytes=nbytes, readonly=True)
    except (ValueError, RuntimeError) as error:  # not in the pool, a pool asleep, closed
        _log.log(_FALLBACK_LEVEL, "rrmm: %s goes by copy: %s", type(x).__name__, error)
        raise NotImplementedError(str(error)) from error
    header = {
        "path": pub.path,
        "name": name,
        "kind": kind,
        "dtype": x.dtype.str,
        "shape": list(x.shape),
        "strides": list(x.strides),
        "offset": offset,
    }
    return header, []


def _attachment(path: str) -> rrmm.share.Attachment:
    with _lock:
        attachment = _attachments.get(path)
        if attachment is not None and not attachment.exporter_gone:
            return attachment
        attachment = rrmm.share.attach(path=path)
        _attachments[path] = attachment
        return attachment


class _Lease:
    """The received block, owned by the arrays built over it: the name is released when the
    last of them goes (a ``weakref.finalize`` on this object: views of views keep it)."""

    def __init__(self, attachment: rrmm.share.Attachment, shared: Any) -> None:
        self.shared = shared
        if shared.host:  # numpy.asarray(lease) on host memory
            self.__array_interface__ = shared.__array_interface__
        weakref.finalize(self, _release, attachment, shared.name)


def _release(attachment: rrmm.share.Attachment, name: str) -> None:
    try:
        attachment.release([name])
    except Exception as error:  # noqa: BLE001 (the exporter is gone: nothing to release)
        _log.debug("rrmm: releasing %s: %s", name, error)


def deserialize(header: dict[str, Any], frames: list[Any]) -> Any:
    """The receiver's half: attaches to the sender's publication and builds the array over
    the named block, with no copy."""
    attachment = _attachment(header["path"])
    shared = attachment.get(header["name"])
    lease = _Lease(attachment, shared)
    shape, strides = tuple(header["shape"]), tuple(header["strides"])
    if header["kind"] == "cupy":
        import cupy

        memory = cupy.cuda.UnownedMemory(shared.ptr, shared.nbytes, lease,
                                         cupy.cuda.runtime.getDevice())
        pointer = cupy.cuda.MemoryPointer(memory, int(header["offset"]))
        return cupy.ndarray(shape, header["dtype"], memptr=pointer, strides=strides)
    import numpy

    raw = numpy.asarray(lease)
    return numpy.ndarray(shape, header["dtype"], buffer=raw, offset=int(header["offset"]),
                         strides=strides)


def register() -> None:
    """Registers the family with distributed (once per process; importing rrmm.dask does)."""
    from distributed.protocol.serialize import register_serialization_family

    register_serialization_family(FAMILY, serialize, deserialize)
