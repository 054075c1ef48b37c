"""``rrmm.shared_gpu``: one GPU, many processes (rrmm extension).

Processes that join a GPU's ledger give memory back to each other: when an allocation of one
runs out, the others trim the free memory their pools keep (those above their soft share
first), then idle processes above their share put their expandable pool to sleep (live data to
host memory, addresses kept; it wakes at its next use). Only then is the allocation refused.

Join with ``rrmm.reinitialize(..., share_gpu=True)``, with :func:`join`, or without code with
``RRMM_SHARE_GPU=1`` (``RRMM_SHARE_SOFT`` / ``RRMM_SHARE_HARD``: sizes or percentages of the
device; ``RRMM_SHARE_NAME``; ``RRMM_LEDGER_DIR``: where ledgers live, default
``/dev/shm/rrmm-ledger-<uid>``). Where the MPS pinned memory limit is set
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) it is the process's hard limit unless one is given.

Declare idle points with :func:`idle` (a context manager), :func:`declare_idle` /
:func:`declare_busy`, :func:`idle_between_cells` (IPython), or the Dask plugin's ``idle_after``.
While idle, a process's expandable pool may be put to sleep; it wakes when the process is busy
again, at its next allocation, or at one of rrmm's copies of its memory. Kernels launched on its
arrays while it sleeps would touch unmapped memory: declare busy before GPU work.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rrmm import _rrmm
from rrmm.mr import DeviceMemoryResource, get_current_device_resource

__all__ = [
    "ProcessRow",
    "ask",
    "declare_busy",
    "declare_idle",
    "history",
    "idle",
    "idle_between_cells",
    "join",
    "joined",
    "leave",
    "processes",
    "read_ledgers",
    "status",
]


def _mr(mr: DeviceMemoryResource | None) -> DeviceMemoryResource:
    target = get_current_device_resource() if mr is None else mr
    if not isinstance(target, DeviceMemoryResource):
        raise TypeError(
            f"rrmm.shared_gpu takes a memory resource (rrmm.mr.*), not {type(target).__name__}"
        )
    return target


def join(
    mr: DeviceMemoryResource | None = None,
    *,
    soft_share: int | str | None = None,
    hard_limit: int | str | None = None,
    name: str | None = None,
    directory: str | os.PathLike[str] | None = None,
    device_key: str | None = None,
) -> str:
    """Joins the ledger of the GPU under ``mr`` (default: the current device resource).

    ``soft_share``: the bytes this process may hold before it is asked first to give back, and
    beyond which it may be put to sleep when idle (default: an equal part of the device among
    the processes that did not ask for a share); ``hard_limit``: bytes it never passes (default:
    the MPS pinned memory limit where set, else none); sizes are bytes, strings such as
    ``"10GiB"`` or percentages of the device (``"25%"``). ``name`` names the process in the
    ledger; ``directory`` and ``device_key`` choose the ledger (tests; a simulated device's key
    is ``simulated-<bytes>``). Joining again replaces the options. Returns the ledger's
    directory.

    Every option is checked before anything changes (a refused join leaves a previous one as
    it was): ``TypeError`` for a value of the wrong type (``soft_share=True`` is no size),
    ``ValueError`` for a size that does not parse, a percentage above 100%, a soft share above
    the device or above the hard limit (the user's or MPS's), an MPS limit
    (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) that does not read, a ``device_key`` that cannot name
    a directory; ``RuntimeError`` for a directory others can write.
    """
    target = _mr(mr)
    return str(
        _rrmm._shared_gpu_join(
            target,
            soft_share=soft_share,
            hard_limit=hard_limit,
            name=name,
            directory=None if directory is None else os.fspath(directory),
            device_key=device_key,
        )
    )


def leave(mr: DeviceMemoryResource | None = None) -> bool:
    """Leaves the ledger of the GPU under ``mr``; whether this process was in it."""
    return bool(_rrmm._shared_gpu_leave(_mr(mr)))


def joined(mr: DeviceMemoryResource | None = None) -> bool:
    """Whether this process is in the ledger of the GPU under ``mr``."""
    return _rrmm._shared_gpu_status(_mr(mr)) is not None


def status(mr: DeviceMemoryResource | None = None) -> dict[str, Any] | None:
    """This process's membership: directory, socket, pid, soft share, hard limit (and where it
    comes from: ``"user"`` or ``"mps"``), idle; ``None`` when it has not joined."""
    result: dict[str, Any] | None = _rrmm._shared_gpu_status(_mr(mr))
    return result


def declare_idle(mr: DeviceMemoryResource | None = None) -> None:
    """Declares this process idle on the GPU under ``mr``: while it is, its expandable pool may
    be put to sleep when another process needs the memory (and only if it holds more than its
    soft share). Declare busy (:func:`declare_busy`) before launching GPU work again."""
    _rrmm._shared_gpu_set_idle(_mr(mr), True)


def declare_busy(mr: DeviceMemoryResource | None = None) -> int:
    """Declares this process busy again: pools the ledger put to sleep wake now (addresses and
    bytes as they were), and data that spilled to host pages moves back to the device where
    it has room (a safe point: ``rrmm.at_rest``). Returns the bytes woken."""
    target = _mr(mr)
    woken = int(_rrmm._shared_gpu_set_idle(target, False))
    with contextlib.suppress(MemoryError):  # no room on the host: the spilled data stays there
        target.at_rest()
    return woken


@contextlib.contextmanager
def idle(mr: DeviceMemoryResource | None = None) -> Iterator[None]:
    """``with rrmm.shared_gpu.idle(): ...``: idle inside the block (no GPU work there), busy
    after it (what slept meanwhile is awake when the block ends)."""
    target = _mr(mr)
    declare_idle(target)
    try:
        yield
    finally:
        declare_busy(target)


def idle_between_cells(ipython: Any = None, mr: DeviceMemoryResource | None = None) -> None:
    """In IPython or Jupyter: idle between cells, busy while one runs (a cell's first GPU work
    finds its data awake). ``ipython`` defaults to the running shell."""
    if ipython is None:
        try:
            from IPython import get_ipython  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise RuntimeError("idle_between_cells() needs IPython") from None
        ipython = get_ipython()
        if ipython is None:
            raise RuntimeError("idle_between_cells() runs inside IPython or Jupyter")
    target = _mr(mr)
    if not joined(target):
        raise RuntimeError(
            "this process has not joined the GPU's ledger: call rrmm.shared_gpu.join() first"
        )

    def busy(*_: Any) -> None:
        declare_busy(target)

    def rest(*_: Any) -> None:
        declare_idle(target)

    ipython.events.register("pre_run_cell", busy)
    ipython.events.register("post_run_cell", rest)
    rest()


@dataclass(frozen=True)
class ProcessRow:
    """One process of a GPU's ledger."""

    pid: int
    name: str
    total: int
    live: int
    cached: int
    soft_share: int | None
    hard_limit: int | None
    hard_limit_from: str
    idle: bool
    asleep: int
    waiting: int
    updated: float
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Its pid namespace (the inode of ``/proc/<pid>/ns/pid``): processes in containers that
    #: share ``/dev/shm`` may have the same pid in different namespaces.
    pid_ns: int = 0
    #: Its process cannot be seen from here (another pid namespace) and its entry was not
    #: written for a minute: left out of every figure, never removed from here.
    stale: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProcessRow:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def processes(mr: DeviceMemoryResource | None = None) -> list[ProcessRow]:
    """Every process in the ledger of the GPU under ``mr`` (this one included), by pid; the
    stale ones (``ProcessRow.stale``: another pid namespace, not written for a minute) last."""
    rows, _refused = _rrmm._shared_gpu_processes(_mr(mr))
    return [ProcessRow.from_dict(r) for r in rows]


def refused_files(mr: DeviceMemoryResource | None = None) -> list[tuple[str, str]]:
    """Files of the ledger's directory that were not read as entries, and why."""
    _rows, refused = _rrmm._shared_gpu_processes(_mr(mr))
    return list(refused)


def history(mr: DeviceMemoryResource | None = None) -> list[dict[str, Any]]:
    """What this process asked, gave, slept and woke, oldest first (dicts: ``at``, ``kind``,
    ``peer``, ``bytes``, ``given``, ``seconds``, ``note``)."""
    return list(_rrmm._shared_gpu_history(_mr(mr)))


def ask(nbytes: int, mr: DeviceMemoryResource | None = None) -> dict[str, Any]:
    """Asks the other processes for room for ``nbytes`` as an allocation that ran out does;
    returns what they answered (``shortfall``, ``trimmed``, ``slept``, ``claimed``: what the
    answers said they gave, counted or not, since an entry is written every quarter second;
    who was asked, ``unanswered``: who did not answer in time or could not be reached,
    ``seconds``,
    ``note``: why not more, naming those and the deadline). Each wait has a deadline (a second
    for trims); an answer counts only from the process asked and at most what its entry shows
    it gave."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, not {nbytes!r}")
    return dict(_rrmm._shared_gpu_ask(_mr(mr), nbytes))


def read_ledgers(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Every GPU's ledger under ``directory`` (default: where ledgers live), without joining and
    without removing anything: ``{key: {"processes": [ProcessRow, ...], "refused": [(file,
    why), ...]}}`` (entries of processes seen dead are refused, saying so; stale ones are rows
    with ``stale=True``)."""
    base = os.fspath(directory) if directory is not None else _rrmm._shared_gpu_default_directory()
    out: dict[str, Any] = {}
    try:
        keys = sorted(os.listdir(base))
    except OSError:
        return out
    for key in keys:
        path = os.path.join(base, key)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        rows, refused = _rrmm._shared_gpu_read(path)
        out[key] = {
            "processes": [ProcessRow.from_dict(r) for r in rows],
            "refused": list(refused),
        }
    return out


def _engine_idle(idle: bool) -> None:
    """The engines' sleep APIs (``rrmm.compat``): a pause declares the process idle on its GPU's
    ledger, a resume busy first (what the ledger put to sleep meanwhile wakes before the paused
    pools are restored). Nothing where the process has not joined."""
    try:
        target = get_current_device_resource()
    except (RuntimeError, ValueError, TypeError):
        return
    if isinstance(target, DeviceMemoryResource) and _rrmm._shared_gpu_status(target) is not None:
        _rrmm._shared_gpu_set_idle(target, idle)


def _from_reinitialize(devices: list[int], share_gpu: bool | dict[str, Any] | None) -> None:
    """``reinitialize(share_gpu=...)``: joins (True or options) or leaves (False) the ledger of
    each device's new resource; ``None`` leaves it to ``RRMM_SHARE_GPU``."""
    if share_gpu is None:
        return
    from rrmm.mr import get_per_device_resource

    for device in devices:
        target = get_per_device_resource(device)
        if share_gpu is False:
            leave(target)
        elif share_gpu is True:
            join(target)
        else:
            join(target, **share_gpu)
