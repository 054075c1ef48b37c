"""``rrmm.sleep()``: a pool that sleeps and wakes with every address intact (rrmm extension).

The expandable pool (``pool_allocator="expandable"`` or ``rrmm.mr.ExpandableMemoryResource``)
copies its live allocations to pinned host memory and gives its physical memory back to the
driver; on wake it maps memory again at the same addresses and copies the bytes back, so
CuPy arrays, PyTorch tensors, ``DeviceBuffer`` objects and captured CUDA graphs stay valid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from rrmm import _rrmm
from rrmm._sleep_types import PromoteReport, SleepFigures
from rrmm.mr import DeviceMemoryResource, get_current_device_resource


def at_rest(mr: DeviceMemoryResource | None = None) -> PromoteReport:
    """Declares a safe point: no GPU work on the memory of ``mr`` (default: the current
    device resource) is in flight or launched until this returns (between the phases of a
    pipeline, say). Data that spilled to host pages moves back to device memory, at the same
    addresses, as far as the device has room (pools whose ``auto_promote`` is ``"off"`` keep
    it). Nothing happens, not even a synchronization, where nothing spilled. rrmm takes the
    same step on its own at a pool's wake from sleep, at the ledger's busy declaration
    (``rrmm.shared_gpu.declare_busy``) and, in Dask workers set up by ``rrmm.dask.RRMMSetup``,
    whenever no task runs. Returns the promotion's report."""
    target = get_current_device_resource() if mr is None else mr
    report: PromoteReport = target.at_rest()
    return report


def sleep(
    mr: DeviceMemoryResource | None = None,
    *,
    discard: Iterable[Any] | str = (),
    discard_fill: str = "undefined",
) -> contextlib.AbstractContextManager[SleepFigures]:
    """Offloads ``mr`` (default: the current device resource) on enter and restores it on exit.

    ``discard``: buffers (tensors, CuPy arrays, ``DeviceBuffer`` objects or pointers) not worth
    copying by this sleep (exactly their bytes; forgotten at the wake), or ``"all"`` (every
    allocation, as ``offload(discard="all")``); after the wake they hold zeros
    (``discard_fill="zero"``) or anything (``"undefined"``). The arguments are checked here,
    at the call (a TypeError or ValueError naming the argument and the value); every buffer is
    found before anything changes: one that no pool below holds raises and nothing sleeps.
    Yields what the sleep released and copied (``mr.offload()``'s dict).

    Inside the block no work may use the pool's memory; allocations from it, and rrmm's copies of
    its bytes (``copy_to_host``, ``tobytes``, pickling, ...), raise ``RuntimeError`` naming the
    sleep; frees are allowed. Entering waits for the work queued on the pool's
    streams. When the wake cannot map the memory again (another process holds it) the exit
    raises ``MemoryError`` and the data stays on the host: call ``mr.restore()`` again later.
    """
    target = get_current_device_resource() if mr is None else mr
    if not isinstance(target, DeviceMemoryResource):
        raise TypeError(
            f"rrmm.sleep() takes a memory resource (rrmm.mr.*), not {type(target).__name__}"
        )
    buffers: Any = discard
    if not isinstance(discard, str):
        with contextlib.suppress(TypeError):  # not iterable: the check below says so
            buffers = list(discard)
    _rrmm._check_sleep_options(buffers, discard_fill)
    return _asleep(target, buffers, discard_fill)


@contextlib.contextmanager
def _asleep(target: DeviceMemoryResource, discard: Any,
            discard_fill: str) -> Iterator[SleepFigures]:
    """The sleep of ``target``: offloaded for the block, restored after it."""
    figures = target.offload(discard=discard, discard_fill=discard_fill)
    try:
        yield figures
    finally:
        target.restore()
