"""``rrmm.memory_snapshot``: a device's pool segments in the layout of PyTorch's
``torch.cuda.memory._snapshot()``, so PyTorch's memory tools read it."""

from __future__ import annotations

from typing import Any

import rrmm.mr
from rrmm import _rrmm

__all__ = ["memory_snapshot", "memory_summary"]


def memory_snapshot(device: int | None = None) -> dict[str, Any]:
    """Every segment and block of the pool behind ``device``'s resource (the current device when
    None), as ``torch.cuda.memory._snapshot()`` lays them out.

    Returns ``{"segments": [...], "device_traces": [[], ...]}``. Each segment is a dict with
    ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``,
    ``requested_size``, ``stream``, ``segment_type``, ``segment_pool_id``, ``is_expandable``,
    ``frames`` and ``blocks``; each block has ``address``, ``size``, ``requested_size``,
    ``state`` (``"active_allocated"`` or ``"inactive"``) and ``frames``. Blocks cover their
    segment in address order. A segment is an upstream chunk of a pool, or a run of mapped
    pages of an expandable pool. rrmm records no allocation history, so ``device_traces`` holds
    one empty list per device. Save it with ``pickle.dump`` and open it in
    https://pytorch.org/memory_viz, or render it with ``torch.cuda._memory_viz.segment_plot``.
    """
    if device is None:
        device = _rrmm._current_device()
    device = int(device)
    mr = rrmm.mr.get_per_device_resource(device)
    segments = _rrmm._memory_snapshot(mr, device)
    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(1, _rrmm.device_count()))]
    return {"segments": [] if segments is None else segments, "device_traces": traces}


def memory_summary(device: int | None = None) -> str:
    """What the resource chain of ``device`` (the current device when None) holds, as text
    (PyTorch's ``torch.cuda.memory_summary`` is the model): each resource from the top, with
    held, in-use and free bytes, the largest free block and fragmentation where it keeps
    memory, and the free and total memory below the chain. An out-of-memory error carries the
    same table with a hint."""
    if device is None:
        device = _rrmm._current_device()
    mr = rrmm.mr.get_per_device_resource(int(device))
    return f"rrmm memory summary, device {int(device)}\n{_rrmm._memory_summary(mr)}"
