"""Replays driven from Python for ``rrmm replay --compare ...,torch,cupy``.

PyTorch's caching allocator and CuPy's ``MemoryPool`` are reached through their Python APIs, so
their replays run in a Python loop; so does a like-for-like baseline, each rrmm resource named
beside them built as the Rust rows build it (``rrmm._stack.build``) and called through its
Python API (``mr.allocate`` / ``mr.deallocate``). The events come from the engine's own parser
(``rrmm._rrmm.replay_events``). The figures follow the Rust engine (src/replay/engine.rs): an
untimed figures pass, then timed repetitions on the same, warm, allocator, their median
reported; an allocation that fails with out of memory is counted and its free skipped.

PyTorch and CuPy are imported only when a replay names them, never when this module is.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from rrmm import _rrmm
from rrmm._replay_types import FitRecord, ReplayRecord

__all__ = [
    "PEERS",
    "PYTHON_DRIVER",
    "Allocator",
    "LogEvents",
    "PeerUnavailable",
    "fit_limit",
    "fit_rows",
    "load_events",
    "peer_problem",
    "prepare_peers",
    "replay",
    "replay_rows",
    "snapshot_fragmentation",
]

#: The allocators of other libraries ``rrmm replay`` can replay through (always from Python).
PEERS = ("torch", "cupy")

#: ``driver`` of the rows replayed here (the engine's rows say ``"rust"``).
PYTHON_DRIVER = "python"

#: How each peer is installed, for the message when it is not.
INSTALL = {"torch": "pip install torch", "cupy": "pip install cupy-cuda12x (or cupy-cuda13x)"}

#: The logged stream handles that are a default stream (0, legacy, per-thread), as the engine's.
DEFAULT_HANDLES = (0, 1, 2)


class PeerUnavailable(Exception):
    """A peer cannot be replayed here (not installed, no GPU): its message is one line."""


# ------------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class LogEvents:
    """One log's events for a Python loop: ``(allocate, size, slot, stream index)`` tuples."""

    events: list[tuple[int, int, int, int]]
    stream_handles: list[int]
    slot_count: int
    peak_event: int | None
    #: Per slot, (size, stream index) of its last allocation: what a leak left there.
    last_allocation: list[tuple[int, int]]
    #: The log's facts (a record with no figures).
    facts: ReplayRecord


def load_events(path: str, lenient: bool = False) -> LogEvents:
    """The events of the log at ``path``, parsed by the engine (``_rrmm.replay_events``).
    Raises what it raises: ValueError naming file and line, OSError."""
    raw = _rrmm.replay_events(path, lenient)
    sizes = memoryview(raw["sizes"]).cast("Q").tolist()
    slots = memoryview(raw["slots"]).cast("I").tolist()
    streams = memoryview(raw["streams"]).cast("I").tolist()
    events = list(zip(raw["actions"], sizes, slots, streams))
    last = [(0, 0)] * raw["slot_count"]
    for allocate, size, slot, stream in events:
        if allocate:
            last[slot] = (size, stream)
    return LogEvents(events, list(raw["stream_handles"]), raw["slot_count"], raw["peak_event"],
                     last, raw["record"])


# ------------------------------------------------------------------------------- allocators


def _no_call(*_args: Any) -> Any:
    raise RuntimeError("this allocator is closed")


class Allocator:
    """One allocator called from Python. ``allocate(size, stream)`` returns a handle (raising
    one of ``oom`` when out of memory); ``deallocate(handle, size, stream)`` frees it (a handle
    dropped by the replay is gone too: CuPy frees on release). ``streams`` holds what to pass
    for each stream index of the log. The figures methods return None where the allocator does
    not say."""

    name = ""
    setup = ""
    oom: tuple[type[BaseException], ...] = (MemoryError,)
    #: Whether the footprint must be sampled after each allocation for its peak (no peak kept).
    samples_footprint = False

    def __init__(self) -> None:
        self.streams: list[Any] = []
        self.allocate: Callable[[int, Any], Any] = _no_call
        self.deallocate: Callable[[Any, int, Any], None] = _no_call

    def synchronize(self) -> None:
        """Waits for the allocator's stream-ordered work (part of a timed pass)."""

    def start_figures(self) -> None:
        """Resets the allocator's peaks before the figures pass."""

    def footprint(self) -> int | None:
        """Bytes it holds now."""
        return None

    def peak_footprint(self) -> int | None:
        """The most bytes it held since ``start_figures``."""
        return None

    def fragmentation(self) -> float | None:
        """1 - largest free block / free bytes now."""
        return None

    def close(self) -> None:
        """Gives its memory back (after the last pass)."""
        self.allocate = _no_call
        self.deallocate = _no_call
        self.streams = []


def snapshot_fragmentation(segments: Sequence[dict[str, Any]]) -> float:
    """External fragmentation from PyTorch-style snapshot segments: 1 - the largest inactive
    block / the inactive bytes (0 when nothing is inactive)."""
    free = [int(b["size"]) for s in segments for b in s["blocks"] if b["state"] == "inactive"]
    total = sum(free)
    return 0.0 if total == 0 else 1.0 - max(free) / total


class TorchAllocator(Allocator):
    """PyTorch's caching allocator on the current device (its cache emptied first):
    ``torch.cuda.caching_allocator_alloc(size, device, stream)`` on one ``torch.cuda.Stream``
    per stream of the log (its default stream for the log's default streams), under a limit
    (``set_per_process_memory_fraction``) when one is given."""

    name = "torch"

    def __init__(self, torch: ModuleType, stream_handles: Sequence[int],
                 limit: int | None = None) -> None:
        super().__init__()
        cuda = torch.cuda
        self._cuda = cuda
        self.device = int(cuda.current_device())
        self.total = int(cuda.get_device_properties(self.device).total_memory)
        self.limit = limit
        cuda.synchronize(self.device)
        cuda.empty_cache()
        if limit is not None:
            cuda.set_per_process_memory_fraction(min(1.0, limit / self.total), self.device)
        self.oom = (cuda.OutOfMemoryError,)
        self.setup = (f"PyTorch {torch.__version__} caching allocator on cuda:{self.device} "
                      "(torch.cuda.caching_allocator_alloc/_delete), its cache emptied first")
        default = cuda.default_stream(self.device)
        self._owned = [default if h in DEFAULT_HANDLES else cuda.Stream(self.device)
                       for h in stream_handles]
        self.streams = [int(s.cuda_stream) for s in self._owned]
        alloc, delete, device = cuda.caching_allocator_alloc, cuda.caching_allocator_delete, \
            self.device
        self.allocate = lambda size, stream: alloc(size, device, stream)
        self.deallocate = lambda ptr, size, stream: delete(ptr)

    def synchronize(self) -> None:
        self._cuda.synchronize(self.device)

    def start_figures(self) -> None:
        self._cuda.reset_peak_memory_stats(self.device)

    def footprint(self) -> int | None:
        return int(self._cuda.memory_reserved(self.device))

    def peak_footprint(self) -> int | None:
        return int(self._cuda.max_memory_reserved(self.device))

    def fragmentation(self) -> float | None:
        segments = [s for s in self._cuda.memory_snapshot()
                    if int(s.get("device", self.device)) == self.device]
        return snapshot_fragmentation(segments)

    def close(self) -> None:
        super().close()
        self._cuda.synchronize(self.device)
        self._owned = []
        self._cuda.empty_cache()
        if self.limit is not None:
            self._cuda.set_per_process_memory_fraction(1.0, self.device)


class CupyAllocator(Allocator):
    """A fresh ``cupy.cuda.MemoryPool``: ``pool.malloc(size)`` with the log's stream current
    (one ``cupy.cuda.Stream`` per stream of the log, the null stream for its default streams);
    the ``MemoryPointer`` is kept until the log frees it. Under ``pool.set_limit`` when a limit
    is given. Its free blocks are not visible: no fragmentation figure."""

    name = "cupy"
    samples_footprint = True

    def __init__(self, cupy: ModuleType, stream_handles: Sequence[int],
                 limit: int | None = None) -> None:
        super().__init__()
        cuda = cupy.cuda
        self._cuda = cuda
        self.device = int(cuda.Device().id)
        self.total = int(cuda.Device(self.device).mem_info[1])
        self.pool = cuda.MemoryPool()
        if limit is not None:
            self.pool.set_limit(size=limit)
        self.oom = (cuda.memory.OutOfMemoryError,)
        self.setup = (f"CuPy {cupy.__version__} MemoryPool, fresh, on device {self.device} "
                      "(pool.malloc with the log's stream current)")
        null = cuda.Stream.null
        self._null = null
        self.streams = [null if h in DEFAULT_HANDLES else cuda.Stream(non_blocking=True)
                        for h in stream_handles]
        malloc = self.pool.malloc
        current: list[Any] = [None]

        def allocate(size: int, stream: Any) -> Any:
            if stream is not current[0]:
                stream.use()
                current[0] = stream
            return malloc(size)

        self.allocate = allocate
        self.deallocate = lambda handle, size, stream: None  # dropping the pointer frees

    def synchronize(self) -> None:
        self._cuda.Device(self.device).synchronize()

    def footprint(self) -> int | None:
        return int(self.pool.total_bytes())

    def close(self) -> None:
        super().close()
        self._cuda.Device(self.device).synchronize()
        self.pool.free_all_blocks()
        self._null.use()


class RrmmAllocator(Allocator):
    """An rrmm resource of kind ``kind`` built by ``rrmm._stack.build`` (the builder behind the
    Rust rows), called through its Python API; the footprint and fragmentation from its
    PyTorch-style statistics and snapshot, where it has a pool."""

    def __init__(self, kind: str, stream_handles: Sequence[int], simulate: int | None,
                 options: dict[str, Any], setup: str | None = None) -> None:
        super().__init__()
        from rrmm import _stack

        self.mr: Any = _stack.build(kind, simulate=simulate, **options)
        self.name = kind
        self.setup = (f"{setup}; " if setup else "") + (
            "called through rrmm's Python API (mr.allocate / mr.deallocate)")
        self._real = self.mr._rrmm_kind in ("device", "managed", "pinned_host")
        defaults = {0: _rrmm.DEFAULT_STREAM, 1: _rrmm.LEGACY_DEFAULT_STREAM,
                    2: _rrmm.PER_THREAD_DEFAULT_STREAM}
        self.streams = [defaults[h] if h in defaults else self._stream(i)
                        for i, h in enumerate(stream_handles)]
        self.allocate = self.mr.allocate
        self.deallocate = self.mr.deallocate

    def _stream(self, index: int) -> _rrmm.Stream:
        # On the GPU a created stream (non-blocking, as the engine's); elsewhere only a key.
        return _rrmm.Stream(flags=1) if self._real else _rrmm.Stream._from_handle(0x1000 + index)

    def synchronize(self) -> None:
        if self._real:
            for stream in {int(s): s for s in self.streams}.values():
                stream.synchronize()

    def start_figures(self) -> None:
        _rrmm._reset_peak_memory_stats(self.mr)

    def _stat(self, key: str) -> int | None:
        stats = _rrmm._memory_stats(self.mr)
        return None if stats is None else int(stats[key])

    def footprint(self) -> int | None:
        return self._stat("reserved_bytes.all.current")

    def peak_footprint(self) -> int | None:
        return self._stat("reserved_bytes.all.peak")

    def fragmentation(self) -> float | None:
        segments = _rrmm._memory_snapshot(self.mr, 0)
        return None if segments is None else snapshot_fragmentation(segments)

    def close(self) -> None:
        self.synchronize()
        super().close()
        self.mr = None
        gc.collect()


# ------------------------------------------------------------------------------- passes


@dataclass
class Figures:
    """What the figures pass measures."""

    peak: int = 0
    sampled_peak: int | None = None
    fragmentation_at_peak: float | None = None
    failure_events: list[int] = field(default_factory=list)
    failed_bytes: int = 0
    timed_ns: int = 0
    peak_footprint: int | None = None
    footprint_at_end: int | None = None
    fragmentation_at_end: float | None = None
    leaked_allocations: int = 0
    leaked_bytes: int = 0


def _free_live(log: LogEvents, a: Allocator, live: list[Any]) -> tuple[int, int]:
    """Frees what the log left live (its leaks); (count, bytes) of those that hold memory."""
    count = total = 0
    for slot in range(len(live)):
        if live[slot] is None:
            continue
        size, stream = log.last_allocation[slot]
        if size:
            a.deallocate(live[slot], size, a.streams[stream])
            count += 1
            total += size
        live[slot] = None
    return count, total


def _timed_pass(log: LogEvents, a: Allocator, live: list[Any]) -> int:
    """One pass with nothing but the calls (and the final synchronization) inside the clock;
    its nanoseconds. Leaves the leaks in ``live``."""
    allocate, deallocate, streams, oom = a.allocate, a.deallocate, a.streams, a.oom
    started = time.perf_counter_ns()
    for is_allocate, size, slot, stream in log.events:
        if is_allocate:
            try:
                live[slot] = allocate(size, streams[stream])
            except oom:
                live[slot] = None
        elif live[slot] is not None:
            # No local name for the handle: CuPy frees when the last reference goes.
            if size:
                deallocate(live[slot], size, streams[stream])
            live[slot] = None
    a.synchronize()
    return time.perf_counter_ns() - started


def _figures_pass(log: LogEvents, a: Allocator) -> Figures:
    """The first pass: peak bytes in use, the footprint's peak, fragmentation at the log's peak
    event and at the end, the failures, the leaks (then freed); the clock stops while figures
    are read."""
    f = Figures()
    live: list[Any] = [None] * log.slot_count
    in_use = 0
    a.start_figures()
    segment = time.perf_counter_ns()
    for i, (is_allocate, size, slot, stream) in enumerate(log.events):
        grew = False
        if is_allocate:
            try:
                live[slot] = a.allocate(size, a.streams[stream])
                in_use += size
                grew = True
            except a.oom:
                live[slot] = None
                f.failure_events.append(i)
                f.failed_bytes += size
        elif live[slot] is not None:
            if size:
                a.deallocate(live[slot], size, a.streams[stream])
                in_use -= size
            live[slot] = None
        f.peak = max(f.peak, in_use)
        if (grew and a.samples_footprint) or i == log.peak_event:
            f.timed_ns += time.perf_counter_ns() - segment
            _sample(f, a, at_peak=i == log.peak_event)
            segment = time.perf_counter_ns()
    a.synchronize()
    f.timed_ns += time.perf_counter_ns() - segment
    _end_figures(f, a)
    f.leaked_allocations, f.leaked_bytes = _free_live(log, a, live)
    return f


def _sample(f: Figures, a: Allocator, at_peak: bool) -> None:
    if a.samples_footprint:
        now = a.footprint()
        if now is not None:
            f.sampled_peak = max(f.sampled_peak or 0, now)
    if at_peak:
        f.fragmentation_at_peak = a.fragmentation()


def _end_figures(f: Figures, a: Allocator) -> None:
    f.footprint_at_end = a.footprint()
    f.fragmentation_at_end = a.fragmentation()
    known = [v for v in (a.peak_footprint(), f.sampled_peak, f.footprint_at_end) if v is not None]
    f.peak_footprint = max(known) if known else None
    if f.fragmentation_at_peak is None and f.fragmentation_at_end is not None:
        f.fragmentation_at_peak = 0.0  # nothing was ever in use: as the engine says


def _repetitions(log: LogEvents, a: Allocator, repeat: int | None) -> list[int]:
    """The timed repetitions' nanoseconds, each after the previous one's leaks are freed."""
    samples: list[int] = []
    live: list[Any] = [None] * log.slot_count
    started = time.perf_counter_ns()
    while _rrmm.replay_more_repetitions(repeat, len(samples), time.perf_counter_ns() - started):
        samples.append(_timed_pass(log, a, live))
        _free_live(log, a, live)
    return samples


def _timings(record: ReplayRecord, samples: list[int], repeats: int) -> None:
    """Sets the timing figures of ``record`` from the repetitions' nanoseconds, by the engine's
    rule (``rrmm._rrmm.replay_timings``)."""
    t = _rrmm.replay_timings(samples, record["events"])
    record["total_ns"] = t["total_ns"]
    record["ns_per_event"] = t["ns_per_event"]
    record["ns_per_event_min"] = t["ns_per_event_min"]
    record["ns_per_event_max"] = t["ns_per_event_max"]
    record["ns_per_event_p25"] = t["ns_per_event_p25"]
    record["ns_per_event_p75"] = t["ns_per_event_p75"]
    record["spread"] = t["spread"]
    record["repeats"] = repeats
    record["samples_ns"] = list(samples)


def _memory(record: ReplayRecord, f: Figures) -> None:
    """Sets the memory figures of ``record`` from the figures pass."""
    record["peak_bytes_in_use"] = f.peak
    record["peak_footprint"] = f.peak_footprint
    record["overhead"] = (f.peak_footprint / f.peak
                          if f.peak_footprint is not None and f.peak > 0 else None)
    record["fragmentation_at_peak"] = f.fragmentation_at_peak
    record["fragmentation_at_end"] = f.fragmentation_at_end
    record["footprint_at_end"] = f.footprint_at_end
    record["failed_allocations"] = len(f.failure_events)
    record["failed_bytes"] = f.failed_bytes
    record["failure_events"] = f.failure_events
    record["leaked_allocations"] = f.leaked_allocations
    record["leaked_bytes"] = f.leaked_bytes


def _record(log: LogEvents, name: str, setup: str | None) -> ReplayRecord:
    """The log's facts as a row of ``name`` driven from Python, with no figures yet."""
    record = log.facts.copy()
    record["resource"] = name
    record["driver"] = PYTHON_DRIVER
    record["setup"] = setup
    return record


def replay(log: LogEvents, a: Allocator, repeat: int | None = None) -> ReplayRecord:
    """Replays ``log`` through ``a``: the figures pass, then the timed repetitions (``repeat``
    of them; None: at least 5 and 0.5 s, at most 1000; 0: the figures pass is the timing).
    Waste and the timeline are not measured (None)."""
    f = _figures_pass(log, a)
    samples = _repetitions(log, a, repeat)
    record = _record(log, a.name, a.setup)
    _timings(record, samples or [f.timed_ns], len(samples))
    _memory(record, f)
    return record


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


def _fits(log: LogEvents, make: Callable[[int], Allocator]) -> Callable[[int], bool]:
    """Whether the log replays with no failed allocation into the allocator ``make(limit)``
    makes (an untimed pass)."""

    def fits(limit: int) -> bool:
        a = make(limit)
        try:
            return not _figures_pass(log, a).failure_events
        finally:
            a.close()

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


def _make(name: str, modules: dict[str, ModuleType], log: LogEvents,
          limit: int | None = None) -> TorchAllocator | CupyAllocator:
    if name == "torch":
        return TorchAllocator(modules["torch"], log.stream_handles, limit)
    return CupyAllocator(modules["cupy"], log.stream_handles, limit)


def _error_row(log: LogEvents, name: str, error: BaseException, setup: str | None) -> ReplayRecord:
    record = _record(log, name, setup)
    record["error"] = f"{type(error).__name__}: {error}"
    return record


def _replay_closing(log: LogEvents, name: str, make: Callable[[], Allocator],
                    repeat: int | None, setup: str | None = None) -> ReplayRecord:
    """One row: ``make()``'s allocator replayed and closed; a row with ``error`` when it cannot
    be made or fails with anything but out of memory."""
    try:
        a = make()
    except Exception as e:  # noqa: BLE001 - a row that says why, as the engine's
        return _error_row(log, name, e, setup)
    try:
        return replay(log, a, repeat)
    except Exception as e:  # noqa: BLE001 - as above
        return _error_row(log, name, e, a.setup)
    finally:
        a.close()


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
        log = load_events(path, lenient)
        for name in names:
            if name in PEERS:
                make: Callable[[], Allocator] = functools.partial(_make, name, modules, log)
                out.append(_replay_closing(log, name, make, repeat))
                continue
            rust = by_key.get((log.facts["log"], name))
            setup = rust["setup"] if rust is not None else None
            if rust is not None:
                out.append(rust)
            make = functools.partial(RrmmAllocator, name, log.stream_handles, simulate, options,
                                     setup)
            out.append(_replay_closing(log, name, make, repeat, setup))
    return out


def _fit_record(log: LogEvents, name: str, outcome: FitOutcome, setup: str) -> FitRecord:
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


def fit_rows(files: Sequence[str], peers: Sequence[str], modules: dict[str, ModuleType],
             lenient: bool = False) -> list[FitRecord]:
    """Per log and peer, the smallest memory limit under which the log replays with no failed
    allocation (untimed passes; at most the device's memory)."""
    out: list[FitRecord] = []
    for path in files:
        log = load_events(path, lenient)
        for peer in peers:
            probe = _make(peer, modules, log)
            cap = probe.total
            probe.close()
            make = functools.partial(_make, peer, modules, log)
            outcome = fit_limit(_fits(log, make), log.facts["log_peak_bytes"], cap)
            out.append(_fit_record(log, peer, outcome, LIMITS[peer]))
    return out
