"""``rrmm.memory_snapshot``: a device's pool segments in the layout of PyTorch's
``torch.cuda.memory._snapshot()``, so PyTorch's memory tools read it."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import rrmm.mr
from rrmm import _rrmm

__all__ = ["memory_snapshot", "memory_summary", "record_memory_history"]


def _device(device: Any) -> int:
    """A device argument as RMM takes one: an int or an integer-like object (``numpy.int64``,
    anything with ``__index__``); the current device when None. A ``str`` or a ``float`` is a
    TypeError, never coerced."""
    if device is None:
        return int(_rrmm._current_device())
    try:
        return operator.index(device)
    except TypeError:
        raise TypeError(
            f"device must be an int, not {type(device).__name__} {device!r}"
        ) from None


def memory_snapshot(device: int | None = None) -> dict[str, Any]:
    """Every segment and block of the pool behind ``device``'s resource (the current device when
    None), as ``torch.cuda.memory._snapshot()`` lays them out.

    Returns ``{"segments": [...], "device_traces": [[], ...]}``. Each segment is a dict with
    ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``,
    ``requested_size``, ``stream``, ``segment_type``, ``segment_pool_id``, ``is_expandable``,
    ``frames`` and ``blocks``; each block has ``address``, ``size``, ``requested_size``,
    ``state`` (``"active_allocated"`` or ``"inactive"``) and ``frames``. Blocks cover their
    segment in address order. A segment is an upstream chunk of a pool, or a run of mapped
    pages of an expandable pool. ``device_traces`` holds, per device, what
    ``record_memory_history`` recorded (empty lists when it is off). Save it with ``pickle.dump`` and open it in
    https://pytorch.org/memory_viz, or render it with ``torch.cuda._memory_viz.segment_plot``.

    rrmm's own additions (new keys, which PyTorch's tools ignore): a segment of a
    ``TieredMemoryResource`` carries ``tier`` (``"device"``, ``"peer"``, ``"host"``), a
    segment of a sleeping expandable pool carries ``offloaded: True`` (its pages given back to
    the driver, its live bytes on the host until ``restore()``; its addresses kept), and
    ``rrmm["sleep"]`` says what a sleep of the stack would release, copy and discard now (the
    resource's own ``sleep_estimate()``; None for a stack without an expandable pool, which
    cannot sleep), and ``rrmm["shared_gpu"]`` what the ledger of the device's GPU holds where
    this process joined it (``rrmm.shared_gpu``; None where it did not): ``directory``, this
    process's ``pid``, ``processes`` (each a dict of ``rrmm.shared_gpu.ProcessRow``'s fields:
    ``pid``, ``name``, ``soft_share``, ``live``, ``cached``, ``asleep``, ``idle``, ...) and
    ``history`` (what this process asked and gave: ``rrmm.shared_gpu.history()``), and
    ``rrmm["spill"]`` the host pages the stack's expandable pools spill to (the resource's
    ``spill_figures()``; None where none spills).
    """
    device = _device(device)
    mr = rrmm.mr.get_per_device_resource(device)
    segments = _rrmm._memory_snapshot(mr, device)
    devices = max(1, _rrmm.device_count(), device + 1)
    traces: list[list[dict[str, Any]]] = [list(_rrmm._memory_history(d)) for d in range(devices)]
    segments = [] if segments is None else segments
    return {"segments": segments, "device_traces": traces,
            "rrmm": {"sleep": _sleep_estimate(mr), "shared_gpu": _shared_gpu(mr),
                     "spill": _spill_figures(mr)}}


def _spill_figures(mr: Any) -> dict[str, Any] | None:
    """``mr.spill_figures()`` (the host pages its expandable pools spill to), or None where
    none spills."""
    figures = mr.spill_figures()
    return None if figures is None else dict(figures)


def _shared_gpu(mr: Any) -> dict[str, Any] | None:
    """The ledger of the GPU under ``mr`` as this process sees it, or None where it has not
    joined one (or ``mr`` cannot: a CUDA resource without a driver)."""
    from rrmm import shared_gpu

    try:
        status = shared_gpu.status(mr)
        if status is None:
            return None
        rows = shared_gpu.processes(mr)
        history = shared_gpu.history(mr)
    except RuntimeError:
        return None
    return {
        "directory": str(status["directory"]),
        "pid": int(status["pid"]),
        "processes": [dataclasses.asdict(row) for row in rows],
        "history": history,
    }


def _sleep_estimate(mr: Any) -> dict[str, int] | None:
    """``mr.sleep_estimate()`` (the pool's own figures: tags and discards included), or None
    where the stack has no expandable pool to sleep."""
    try:
        return dict(mr.sleep_estimate())
    except RuntimeError:
        return None


def record_memory_history(enabled: str | bool | None = "all", max_entries: int = 100_000,
                          stacks: str | None = "python") -> None:
    """Starts (``enabled="all"`` or True; what was recorded is cleared) or stops (None or
    False) recording allocations and frees made through ``DeviceBuffer`` and the CuPy, Numba
    and PyTorch hooks, on every device, each with its Python stack (``stacks="python"``; None
    for none, cheaper), keeping the newest ``max_entries``. ``memory_snapshot()`` carries the
    record as ``device_traces`` in PyTorch's layout, so ``torch.cuda._memory_viz`` and
    ``rrmm snapshot view`` draw its timeline (PyTorch's ``_record_memory_history`` is the
    model)."""
    # PyTorch's ``_record_memory_history`` takes None, "state" or "all" (and True/False, its
    # legacy form); anything else is refused by type, as its binding does (1 is not True here).
    if not (enabled is None or isinstance(enabled, (bool, str))):
        raise TypeError(f"record_memory_history: enabled must be 'all', 'state', None, True or "
                        f"False, not {type(enabled).__name__} {enabled!r}")
    if isinstance(enabled, str) and enabled not in ("all", "state"):
        raise ValueError(f"record_memory_history: enabled must be 'all', 'state', None, True or "
                         f"False, got {enabled!r}")
    if not (stacks is None or isinstance(stacks, str)):
        raise TypeError(f"record_memory_history: stacks must be 'python', 'all' or None, not "
                        f"{type(stacks).__name__} {stacks!r}")
    if stacks not in ("python", "all", None):
        raise ValueError(f"record_memory_history: stacks must be 'python', 'all' or None, "
                         f"got {stacks!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"record_memory_history: max_entries must be a positive int, "
                         f"got {max_entries!r}")
    on = enabled not in (None, False)
    _rrmm._record_memory_history(on, max_entries, stacks is not None)


def memory_summary(device: int | None = None) -> str:
    """What the resource chain of ``device`` (the current device when None) holds, as text
    (PyTorch's ``torch.cuda.memory_summary`` is the model): each resource from the top, with
    held, in-use and free bytes, the largest free block and fragmentation where it keeps
    memory, and the free and total memory below the chain. An out-of-memory error carries the
    same table with a hint."""
    device = _device(device)
    mr = rrmm.mr.get_per_device_resource(device)
    return f"rrmm memory summary, device {device}\n{_rrmm._memory_summary(mr)}"
