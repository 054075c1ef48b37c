"""``rrmm.share``: one copy, many processes (rrmm extension; issue 49).

An exporter holds segments, each exported once as a file descriptor, and names buffers in them;
importers of the same user attach over a Unix socket in the ledger's directory (only that user
can reach it), receive each segment's descriptor once, map it once, and resolve names to
``__cuda_array_interface__``-style dicts. A free of a name an importer holds waits until it lets
go or exits. If the exporter dies, importers keep what they map, and a new exporter started with
``accept_adoption=True`` takes the segments back (``Attachment.hand_back``), copying nothing.

Segments here are memory files (host memory): the CPU stand-in for the driver's shareable
handles of device memory, which plug in behind the same protocol (``rrmm::shared_memory`` in
Rust).

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
from rrmm._rrmm import ShareExporter as Exporter
from rrmm._rrmm import _share_path

__all__ = ["Attachment", "Exporter", "attach", "path_of", "publish"]


def publish(
    name: str,
    *,
    directory: str | os.PathLike[str] | None = None,
    accept_adoption: bool = False,
) -> Exporter:
    """Starts an exporter named ``name`` (1 to 30 of ``A-Z a-z 0-9 . _ -``) under the ledgers'
    directory (``directory``, default ``RRMM_LEDGER_DIR`` or ``/dev/shm/rrmm-ledger-<uid>``)."""
    return Exporter(name, directory, accept_adoption)


def path_of(name: str, *, directory: str | os.PathLike[str] | None = None) -> str:
    """The socket an exporter named ``name`` listens on."""
    return _share_path(name, directory)


def attach(
    name: str | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    directory: str | os.PathLike[str] | None = None,
    timeout: float = 5.0,
) -> Attachment:
    """Attaches to the exporter named ``name`` (or listening at ``path``); each answer of the
    exporter is waited for at most ``timeout`` seconds."""
    if (name is None) == (path is None):
        raise TypeError("attach takes an exporter's name or its path, one of them")
    if path is None:
        assert name is not None
        path = _share_path(name, directory)
    return Attachment(os.fspath(path), timeout)
