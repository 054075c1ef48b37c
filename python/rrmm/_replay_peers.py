"""The peers of ``rrmm replay --compare ...,torch,cupy``: adapters only.

PyTorch's caching allocator and CuPy's ``MemoryPool`` are reached through their Python APIs; so
is the like-for-like baseline, each rrmm resource named beside them built as the Rust rows build
it (``rrmm._stack.build``) and called through its Python API (``mr.allocate`` /
``mr.deallocate``). Each is an :class:`Adapter`: two functions, ``allocate(size, stream) ->
address`` and ``deallocate(address, size, stream)``, what it holds (``held_bytes``) and its free
blocks (``free_blocks``) where it says, its setup and teardown. The replay itself (the untimed
figures pass, the timed repetitions and their median, the frees of what the log leaves live,
out of memory counted and its free skipped, the row) is the engine's, the one that replays
rrmm's own kinds (src/replay/engine.rs), run over the adapter's functions by
``rrmm._rrmm.replay_allocator``.

PyTorch and CuPy are imported only when a replay names them, never when this module is.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rrmm import _rrmm
from rrmm._replay_types import FitRecord, ReplayRecord

__all__ = [
    "PEERS",
    "PYTHON_DRIVER",
    "Adapter",
    "PeerUnavailable",
    "StreamMap",
    "cupy_adapter",
    "fit_limit",
    "fit_rows",
    "peer_problem",
    "prepare_peers",
    "replay",
    "replay_rows",
    "rrmm_adapter",
    "snapshot_free_blocks",
    "torch_adapter",
]

#: The allocators of other libraries ``rrmm replay`` can replay through (from Python).
PEERS = ("torch", "cupy")

#: ``driver`` of the rows replayed through Python functions (the engine's rows say ``"rust"``).
PYTHON_DRIVER = "python"

#: How each peer is installed, for the message when it is not.
INSTALL = {"torch": "pip install torch", "cupy": "pip install cupy-cuda12x (or cupy-cuda13x)"}

#: The stream handles the engine passes for the log's default streams (default, legacy,
#: per-thread).
DEFAULT_HANDLES = (0, 1, 2)


class PeerUnavailable(Exception):
    """A peer cannot be replayed here (not installed, no GPU): its message is one line."""


# ------------------------------------------------------------------------------- adapters


def _nothing() -> None:
    pass


def _closed(*_args: Any) -> Any:
    raise RuntimeError("this allocator is closed")


@dataclass
class Adapter:
    """An allocator the engine replays through (``rrmm._rrmm.replay_allocator``'s arguments).
    ``allocate(size, stream)`` returns an address (raising MemoryError or one of
    ``out_of_memory`` when out of memory); ``deallocate(address, size, stream)`` frees it;
    ``stream`` is the engine's handle for the log's stream. ``held_bytes()`` and
    ``free_blocks()`` give the footprint and the free blocks' sizes where the allocator says.
    ``device``: the CUDA device of its memory (None when it has none: tests). ``teardown()``
    gives its memory back after the row (:meth:`close`)."""

    name: str
    setup: str
    allocate: Callable[[int, int], int]
    deallocate: Callable[[int, int, int], None]
    held_bytes: Callable[[], int] | None = None
    free_blocks: Callable[[], list[int]] | None = None
    out_of_memory: tuple[type[BaseException], ...] = ()
    device: int | None = None
    teardown: Callable[[], None] = _nothing

    def close(self) -> None:
        """Drops the functions (and what they hold: a resource, a pool), then tears down."""
        self.allocate = self.deallocate = _closed
        self.held_bytes = self.free_blocks = None
        self.teardown()


class StreamMap(dict[int, Any]):
    """What the allocator is given for each stream handle the engine passes: ``make(handle)``
    (its default stream for the log's default streams, ``DEFAULT_HANDLES``, else a stream of
    its own), made on first use and kept; ``value(stream)`` of it."""

    def __init__(self, make: Callable[[int], Any],
                 value: Callable[[Any], Any] = lambda stream: stream) -> None:
        super().__init__()
        self._make, self._value = make, value
        self.owned: list[Any] = []

    def __missing__(self, handle: int) -> Any:
        stream = self._make(handle)
        self.owned.append(stream)
        value = self[handle] = self._value(stream)
        return value

    def close(self) -> None:
        """Forgets every stream."""
        self.clear()
        self.owned.clear()


def snapshot_free_blocks(segments: Sequence[dict[str, Any]]) -> list[int]:
    """The sizes of the free (inactive) blocks of PyTorch-style snapshot segments."""
    return [int(b["size"]) for s in segments for b in s["blocks"] if b["state"] == "inactive"]


def _torch_reserved(torch: ModuleType, device: int) -> Callable[[], int]:
    """The bytes PyTorch's allocator reserves on ``device``: from its nested statistics (one
    call; read after every allocation of the figures pass), else ``memory_reserved``."""
    stats = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)
    if stats is not None:
        try:
            int(stats(device)["reserved_bytes"]["all"]["current"])
        except Exception:  # noqa: BLE001 - a PyTorch without it: the public call
            stats = None
    if stats is not None:
        return lambda: int(stats(device)["reserved_bytes"]["all"]["current"])
    reserved = torch.cuda.memory_reserved
    return lambda: int(reserved(device))


def torch_adapter(torch: ModuleType, gpu: bool = True, limit: int | None = None) -> Adapter:
    """PyTorch's caching allocator on the current device (its cache emptied first):
    ``torch.cuda.caching_allocator_alloc(size, device, stream)`` on one ``torch.cuda.Stream``
    per stream of the log (its default stream for the log's default streams), under a limit
    (``set_per_process_memory_fraction``) when one is given; its free blocks from
    ``memory_snapshot()``. ``gpu`` False: no device for the engine (stand-ins in tests)."""
    cuda = torch.cuda
    device = int(cuda.current_device())
    total = int(cuda.get_device_properties(device).total_memory)
    cuda.synchronize(device)
    cuda.empty_cache()
    if limit is not None:
        cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    default = cuda.default_stream(device)
    streams = StreamMap(lambda h: default if h in DEFAULT_HANDLES else cuda.Stream(device),
                        lambda s: int(s.cuda_stream))
    alloc, delete = cuda.caching_allocator_alloc, cuda.caching_allocator_delete

    def free_blocks() -> list[int]:
        return snapshot_free_blocks([s for s in cuda.memory_snapshot()
                                     if int(s.get("device", device)) == device])

    def teardown() -> None:
        cuda.synchronize(device)
        streams.close()
        cuda.empty_cache()
        if limit is not None:
            cuda.set_per_process_memory_fraction(1.0, device)

    return Adapter(
        name="torch",
        setup=(f"PyTorch {torch.__version__} caching allocator on cuda:{device} "
               "(torch.cuda.caching_allocator_alloc/_delete), its cache emptied first"),
        allocate=lambda size, stream: alloc(size, device, streams[stream]),
        deallocate=lambda ptr, size, stream: delete(ptr),
        held_bytes=_torch_reserved(torch, device),
        free_blocks=free_blocks,
        out_of_memory=(cuda.OutOfMemoryError,),
        device=device if gpu else None,
        teardown=teardown,
    )


def cupy_adapter(cupy: ModuleType, gpu: bool = True, limit: int | None = None) -> Adapter:
    """A fresh ``cupy.cuda.MemoryPool``: ``pool.malloc(size)`` with the log's stream current
    (one ``cupy.cuda.Stream`` per stream of the log, the null stream for its default streams);
    the ``MemoryPointer`` is kept until the log frees it. Under ``pool.set_limit`` when a limit
    is given. Its free blocks are not visible: no fragmentation figure."""
    cuda = cupy.cuda
    device = int(cuda.Device().id)
    pool = cuda.MemoryPool()
    if limit is not None:
        pool.set_limit(size=limit)
    null = cuda.Stream.null
    streams = StreamMap(lambda h: null if h in DEFAULT_HANDLES else cuda.Stream(non_blocking=True))
    malloc = pool.malloc
    live: dict[int, Any] = {}
    current: list[Any] = [None]

    def allocate(size: int, handle: int) -> int:
        stream = streams[handle]
        if stream is not current[0]:
            stream.use()
            current[0] = stream
        memory = malloc(size)
        ptr = int(memory.ptr)
        if ptr:
            live[ptr] = memory
        return ptr

    def deallocate(ptr: int, size: int, handle: int) -> None:
        del live[ptr]  # dropping the pointer frees it

    def teardown() -> None:
        cuda.Device(device).synchronize()
        live.clear()
        pool.free_all_blocks()
        null.use()
        streams.close()

    return Adapter(
        name="cupy",
        setup=(f"CuPy {cupy.__version__} MemoryPool, fresh, on device {device} "
               "(pool.malloc with the log's stream current)"),
        allocate=allocate,
        deallocate=deallocate,
        held_bytes=lambda: int(pool.total_bytes()),
        out_of_memory=(cuda.memory.OutOfMemoryError,),
        device=device if gpu else None,
        teardown=teardown,
    )


def rrmm_adapter(kind: str, simulate: int | None, options: dict[str, Any],
                 setup: str | None = None) -> Adapter:
    """An rrmm resource of kind ``kind`` built by ``rrmm._stack.build`` (the builder behind the
    Rust rows), called through its Python API; the footprint and free blocks from its
    PyTorch-style statistics and snapshot, where it has a pool. On real memory the log's
    streams are the engine's (as its Rust row's); on simulated memory their keys."""
    from rrmm import _stack

    mr = _stack.build(kind, simulate=simulate, **options)
    real = mr._rrmm_kind in ("device", "managed", "pinned_host")
    defaults = {0: _rrmm.DEFAULT_STREAM, 1: _rrmm.LEGACY_DEFAULT_STREAM,
                2: _rrmm.PER_THREAD_DEFAULT_STREAM}
    streams = StreamMap(lambda h: defaults[h] if h in defaults else _rrmm.Stream._from_handle(h))
    allocate, deallocate = mr.allocate, mr.deallocate
    held_bytes = (None if _rrmm._memory_stats(mr) is None
                  else functools.partial(_reserved_bytes, mr))
    free_blocks = (None if _rrmm._memory_snapshot(mr, 0) is None
                   else functools.partial(_free_blocks, mr))

    def teardown() -> None:
        streams.close()
        gc.collect()

    return Adapter(
        name=kind,
        setup=(f"{setup}; " if setup else "")
        + "called through rrmm's Python API (mr.allocate / mr.deallocate)",
        allocate=lambda size, stream: allocate(size, streams[stream]),
        deallocate=lambda ptr, size, stream: deallocate(ptr, size, streams[stream]),
        held_bytes=held_bytes,
        free_blocks=free_blocks,
        device=_rrmm._current_device() if real else None,
        teardown=teardown,
    )


def _reserved_bytes(mr: Any) -> int:
    """What rrmm resource ``mr`` holds, from its PyTorch-style statistics."""
    stats = _rrmm._memory_stats(mr)
    return 0 if stats is None else int(stats["reserved_bytes.all.current"])


def _free_blocks(mr: Any) -> list[int]:
    """The free blocks of rrmm resource ``mr``, from its PyTorch-style snapshot."""
    return snapshot_free_blocks(_rrmm._memory_snapshot(mr, 0) or [])


# ------------------------------------------------------------------------------- replays


def replay(log: _rrmm.ReplayLog, a: Adapter, repeat: int | None = None,
           timed: bool = True) -> ReplayRecord:
    """Replays ``log`` through ``a`` by the engine (``repeat`` timed repetitions after the
    figures pass; None: at least 5 and 0.5 s, at most 1000; ``timed=False``: the figures pass
    alone). Waste and the timeline are not measured (None)."""
    return _rrmm.replay_allocator(
        log, a.name, a.allocate, a.deallocate, held_bytes=a.held_bytes,
        free_blocks=a.free_blocks, out_of_memory=a.out_of_memory, device=a.device,
        setup=a.setup, repeat=repeat, timed=timed)


def _error_row(log: _rrmm.ReplayLog, name: str, error: BaseException,
               setup: str | None) -> ReplayRecord:
    """The row of an allocator that could not be made: the log's facts and why."""
    record = log.facts
    record["resource"] = name
    record["driver"] = PYTHON_DRIVER
    record["setup"] = setup
    record["error"] = f"{type(error).__name__}: {error}"
    return record


def _replay_closing(log: _rrmm.ReplayLog, name: str, make: Callable[[], Adapter],
                    repeat: int | None, setup: str | None = None) -> ReplayRecord:
    """One row: ``make()``'s allocator replayed and closed; a row with ``error`` when it cannot
    be made (or, from the engine, fails with anything but out of memory)."""
    try:
        a = make()
    except Exception as e:  # noqa: BLE001 - a row that says why, as the engine's
        return _error_row(log, name, e, setup)
    try:
        return replay(log, a, repeat)
    finally:
        a.close()


# ------------------------------------------------------------------------------- --fit


@dataclass(frozen=True)
class FitOutcome:
    """What the limit search found: the smallest limit with no failure (None: none up to the
    cap), the largest that failed, the replays run, why there is none."""

    limit: int | None
    failing: int
    replays: int
    reason: str | None = None


def fit_limit(fits: Callable[[int], bool], peak: int, cap: int) -> FitOutcome:
    """The smallest limit in bytes, at most ``cap``, under which ``fits(limit)``: the engine's
    ``--fit`` search (``rrmm._rrmm.fit_search``)."""
    limit, failing, replays = _rrmm.fit_search(fits, peak, cap)
    if limit is None:
        return FitOutcome(None, failing, replays,
                          f"failed allocations even with the whole device ({cap} bytes)")
    return FitOutcome(limit, failing, replays)


def _fits(log: _rrmm.ReplayLog, make: Callable[[int], Adapter]) -> Callable[[int], bool]:
    """Whether the log replays with no failed allocation into the allocator ``make(limit)``
    makes (the engine's figures pass alone); RuntimeError if it fails otherwise."""

    def fits(limit: int) -> bool:
        a = make(limit)
        try:
            row = replay(log, a, timed=False)
        finally:
            a.close()
        if row["error"] is not None:
            raise RuntimeError(f"{a.name}: {row['error']}")
        return not row["failed_allocations"]

    return fits


# ------------------------------------------------------------------------------- the command


def _installed(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def peer_problem(peers: Sequence[str], simulate: int | None, gpu: bool) -> str | None:
    """Why ``peers`` cannot be replayed (one line), or None: they need a real GPU (not
    ``--simulate``) and their package."""
    if not peers:
        return None
    named = " and ".join(peers)
    if simulate is not None:
        return (f"{named} can only be replayed on the GPU (their allocators take real device "
                f"memory); --simulate replays on simulated memory: drop --simulate, or drop "
                f"{named} from --compare")
    for peer in peers:
        if not _installed(peer):
            return f"{peer} is not installed ({INSTALL[peer]}), or drop it from --compare"
    if not gpu:
        return (f"{named} need a GPU and none was found; without them the replay runs on "
                "simulated memory")
    return None


def prepare_peers(peers: Sequence[str]) -> dict[str, ModuleType]:
    """Imports each peer and checks that it sees a GPU; PeerUnavailable (one line) if not."""
    modules: dict[str, ModuleType] = {}
    for peer in peers:
        try:
            module = importlib.import_module(peer)
        except Exception as e:  # a broken install is reported, not raised
            raise PeerUnavailable(f"{peer} cannot be imported: {type(e).__name__}: {e}") from e
        if not module.cuda.is_available():
            raise PeerUnavailable(f"{peer} sees no CUDA device (a CPU-only build?)")
        modules[peer] = module
    return modules


def _make(name: str, modules: dict[str, ModuleType], gpu: bool,
          limit: int | None = None) -> Adapter:
    make = torch_adapter if name == "torch" else cupy_adapter
    return make(modules[name], gpu, limit)


def replay_rows(files: Sequence[str], names: Sequence[str], rust_rows: Sequence[ReplayRecord],
                modules: dict[str, ModuleType], *, options: dict[str, Any],
                simulate: int | None = None, repeat: int | None = None,
                lenient: bool = False) -> list[ReplayRecord]:
    """Every row, per log in order, per name in order: an rrmm resource's row from the engine
    (``rust_rows``) followed by the same resource driven from Python; a peer's row. ``options``
    are the stacks' options (as the engine's); ``simulate`` only for tests without a GPU."""
    by_key = {(r["log"], r["resource"]): r for r in rust_rows}
    out: list[ReplayRecord] = []
    for path in files:
        log = _rrmm.ReplayLog(path, lenient)
        for name in names:
            make: Callable[[], Adapter]
            if name in PEERS:
                make = functools.partial(_make, name, modules, simulate is None)
                out.append(_replay_closing(log, name, make, repeat))
                continue
            rust = by_key.get((log.facts["log"], name))
            setup = rust["setup"] if rust is not None else None
            if rust is not None:
                out.append(rust)
            make = functools.partial(rrmm_adapter, name, simulate, options, setup)
            out.append(_replay_closing(log, name, make, repeat, setup))
    return out


def _fit_record(log: _rrmm.ReplayLog, name: str, outcome: FitOutcome, setup: str) -> FitRecord:
    return {
        "log": log.facts["log"], "resource": name, "driver": PYTHON_DRIVER,
        "device_bytes": outcome.limit, "failing_bytes": outcome.failing,
        "initial_pool_size": None, "maximum_pool_size": None, "arena_size": None,
        "setup": setup, "replays": outcome.replays, "reason": outcome.reason,
    }


LIMITS = {
    "torch": "a memory limit on the GPU (torch.cuda.set_per_process_memory_fraction)",
    "cupy": "a memory limit on the GPU (MemoryPool.set_limit)",
}


def _total(name: str, module: ModuleType) -> int:
    """The device memory the peer ``name`` sees: the search's cap."""
    cuda = module.cuda
    if name == "torch":
        return int(cuda.get_device_properties(int(cuda.current_device())).total_memory)
    return int(cuda.Device(int(cuda.Device().id)).mem_info[1])


def fit_rows(files: Sequence[str], peers: Sequence[str], modules: dict[str, ModuleType],
             lenient: bool = False, gpu: bool = True) -> list[FitRecord]:
    """Per log and peer, the smallest memory limit under which the log replays with no failed
    allocation (untimed passes; at most the device's memory)."""
    out: list[FitRecord] = []
    for path in files:
        log = _rrmm.ReplayLog(path, lenient)
        for peer in peers:
            make = functools.partial(_make, peer, modules, gpu)
            outcome = fit_limit(_fits(log, make), log.facts["log_peak_bytes"],
                                _total(peer, modules[peer]))
            out.append(_fit_record(log, peer, outcome, LIMITS[peer]))
    return out
