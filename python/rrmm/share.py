"""``rrmm.share``: one copy, many processes (rrmm extension; issue 49).

An exporter holds segments, each exported once as a file descriptor, and names buffers in them;
importers of the same user attach over a Unix socket in the ledger's directory (only that user
can reach it), receive each segment's descriptor once, map it once, and resolve names to
``__cuda_array_interface__``-style dicts. A free of a name an importer holds waits until it lets
go or exits. If the exporter dies, importers keep what they map, and a new exporter started with
``accept_adoption=True`` takes the segments back (``Attachment.hand_back``), copying nothing.

An expandable pool built with ``shareable=True`` is published as a whole: each page a named
array lies on is exported once (the driver's shareable handle; a memory file per page on the
host, the CPU stand-in), and importers map the pages into one range at their offsets, so an
array across pages is contiguous there too::

    pool = rrmm.mr.ExpandableMemoryResource(shareable=True)
    pub = pool.publish("weights")
    pub.share("w", cupy_array)  # its free waits for the importers that hold it

    imp = rrmm.share.attach(pub.path)  # or attach("weights", device=0)
    w = cupy.asarray(imp.get("w"))  # __cuda_array_interface__ (__array_interface__ on host)

Segments of a plain exporter are memory files (host memory).

In one process::

    exp = rrmm.share.publish("weights")
    seg = exp.add_segment(1 << 20)
    exp.write(seg, 0, data)
    exp.publish("w", seg, 0, len(data), "<f4", (len(data) // 4,), readonly=True)

In another::

    imp = rrmm.share.attach("weights")
    imp.resolve("w")  # {"shape": (...), "typestr": "<f4", "data": (address, True), ...}
"""

from __future__ import annotations

import os

from rrmm._rrmm import ShareAttachment as Attachment
from rrmm._rrmm import SharedArray, _share_path
from rrmm._rrmm import ShareExporter as Exporter
from rrmm._rrmm import SharePublication as PoolPublication

__all__ = [
    "Attachment",
    "Exporter",
    "PoolPublication",
    "SharedArray",
    "attach",
    "path_of",
    "publish",
]


def publish(
    name: str,
    *,
    directory: str | os.PathLike[str] | None = None,
    accept_adoption: bool = False,
) -> Exporter:
    """Starts an exporter named ``name`` (1 to 30 of ``A-Z a-z 0-9 . _ -``) under the ledgers'
    directory (``directory``, default ``RRMM_LEDGER_DIR`` or ``/dev/shm/rrmm-ledger-<uid>``)."""
    return Exporter(name, directory, accept_adoption)


def path_of(
    name: str,
    *,
    directory: str | os.PathLike[str] | None = None,
    device: int | None = None,
) -> str:
    """The socket an exporter named ``name`` listens on: of host memory, or of a pool on
    ``device`` (its directory is named by the device's UUID)."""
    return _share_path(name, directory, device)


def attach(
    name: str | os.PathLike[str] | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    directory: str | os.PathLike[str] | None = None,
    device: int | None = None,
    timeout: float = 5.0,
) -> Attachment:
    """Attaches to the exporter named ``name`` (of host memory, or of a pool on ``device``) or
    listening at ``path`` (a first argument with a ``/`` is a path: a publication's ``path``);
    each answer of the exporter is waited for at most ``timeout`` seconds. ``get(name)`` of the
    attachment gives an array-like object (``cupy.asarray``, ``torch.as_tensor``,
    ``numpy.asarray`` on the host)."""
    if name is not None and (isinstance(name, os.PathLike) or os.sep in name):
        if path is not None:
            raise TypeError("attach takes an exporter's name or its path, one of them")
        name, path = None, name
    if (name is None) == (path is None):
        raise TypeError("attach takes an exporter's name or its path, one of them")
    if path is None:
        assert isinstance(name, str)
        path = _share_path(name, directory, device)
    return Attachment(os.fspath(path), timeout)
