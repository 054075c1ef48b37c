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
from collections.abc import Sequence
from typing import Any

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
    "tensors",
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


#: typestr -> the name of PyTorch's dtype (looked up on ``torch`` when it is imported).
_TORCH_DTYPES = {
    "<f2": "float16",
    "<f4": "float32",
    "<f8": "float64",
    "<c8": "complex64",
    "<c16": "complex128",
    "|i1": "int8",
    "<i2": "int16",
    "<i4": "int32",
    "<i8": "int64",
    "|u1": "uint8",
    "<u2": "uint16",
    "<u4": "uint32",
    "<u8": "uint64",
    "|b1": "bool",
}


class _Span:
    """The addresses a batch of a pool's arrays lies in, as one byte array on the device:
    the tensors are views of it. It holds the attachment (and so every map) while any of them
    lives."""

    def __init__(self, attachment: Attachment, start: int, nbytes: int) -> None:
        self.attachment = attachment
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (start, False),
            "version": 3,
            "strides": None,
        }


def _one_tensor(torch: Any, a: SharedArray) -> Any:
    """A tensor over one shared array, the way PyTorch takes an array interface."""
    if a.host:
        import numpy

        return torch.as_tensor(numpy.asarray(a))
    return torch.as_tensor(a, device=f"cuda:{a.__dlpack_device__()[1]}")


def tensors(attachment: Attachment, names: Sequence[str]) -> list[Any]:
    """PyTorch tensors over the shared arrays ``names`` (as ``get_many``), no copy, built in
    one pass: the arrays of a pool that lie in one run of pages this process maps side by side
    become views of one tensor over the addresses they span (``as_strided``: one PyTorch call
    each instead of a ``torch.as_tensor`` of each ``__cuda_array_interface__``); any other
    array (host memory, a dtype PyTorch lacks) goes through ``torch.as_tensor``. A view's
    storage is that span (``torch.save`` of one writes it whole). The tensors keep the
    attachment's maps alive; a read-only name gives a tensor PyTorch lets write (it has no
    read-only tensors)."""
    return _tensors_of(attachment, attachment.get_many(list(names)))


def _tensors_of(
    attachment: Attachment, arrays: Sequence[SharedArray], phases: dict[str, float] | None = None
) -> list[Any]:
    """``tensors`` of arrays resolved already; ``phases`` (when given) gets the seconds of
    each step. The collector is paused meanwhile: a collection in the middle of making
    thousands of tensors walks every object of a process that imported PyTorch."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        return _tensors_without_collection(attachment, arrays, phases)
    finally:
        if collecting:
            gc.enable()


def _tensors_without_collection(
    attachment: Attachment, arrays: Sequence[SharedArray], phases: dict[str, float] | None
) -> list[Any]:
    import time
    from bisect import bisect_right

    import torch

    t0 = time.perf_counter()
    # Each run of pages mapped side by side gets one tensor over the arrays in it: a view's
    # storage (what torch.save writes, for one) covers mapped memory only.
    runs = attachment.placed_runs
    starts = [start for start, _ in runs]
    out: list[Any] = [None] * len(arrays)
    by_run: dict[int, list[tuple[int, int, tuple[int, ...], Any]]] = {}
    dtypes: dict[str, Any] = {}  # typestr -> torch dtype, or False: none
    for i, a in enumerate(arrays):
        typestr = a.typestr
        dtype: Any = dtypes.get(typestr)
        if dtype is None:
            dtype = dtypes[typestr] = getattr(torch, _TORCH_DTYPES.get(typestr, ""), False)
        ptr = a.ptr
        k = bisect_right(starts, ptr) - 1
        if (
            dtype is False
            or a.host
            or k < 0
            or ptr + a.nbytes > runs[k][0] + runs[k][1]
            or ptr % dtype.itemsize
        ):
            out[i] = _one_tensor(torch, a)
            continue
        by_run.setdefault(k, []).append((i, ptr, a.shape, dtype))
    t1 = time.perf_counter()
    base_s = views_s = 0.0
    for spanned in by_run.values():
        t2 = time.perf_counter()
        # 16-byte aligned ends (the widest element): still within the run (whole pages).
        start = min(ptr for _, ptr, _, _ in spanned) & ~15
        end = -(-max(ptr + arrays[i].nbytes for i, ptr, _, _ in spanned) // 16) * 16
        device = arrays[spanned[0][0]].__dlpack_device__()[1]
        base = torch.as_tensor(_Span(attachment, start, end - start), device=f"cuda:{device}")
        t3 = time.perf_counter()
        views: dict[Any, Any] = {}
        for i, ptr, shape, dtype in spanned:
            whole = views.get(dtype)
            if whole is None:
                whole = views[dtype] = base.view(dtype)
            strides = []
            step = 1
            for dim in reversed(shape):
                strides.append(step)
                step *= dim
            strides.reverse()
            out[i] = whole.as_strided(shape, strides, (ptr - start) // dtype.itemsize)
        base_s += t3 - t2
        views_s += time.perf_counter() - t3
    if phases is not None:
        phases.update(classify_s=t1 - t0, base_s=base_s, views_s=views_s)
        phases["spanned"] = sum(len(v) for v in by_run.values())
        phases["runs"] = len(by_run)
    return out
