"""Allocation statistics and the memory profiler (RMM's ``rmm.statistics``)."""

from __future__ import annotations

import inspect
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ContextDecorator, contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import rrmm.mr
from rrmm import _rrmm
from rrmm._rrmm import Statistics

__all__ = [
    "ProfilerRecords",
    "Statistics",
    "default_profiler_records",
    "enable_statistics",
    "get_statistics",
    "memory_stats",
    "pop_statistics",
    "profiler",
    "push_statistics",
    "reset_peak_memory_stats",
    "statistics",
]


def _current_stats_mr() -> Any:
    mr = rrmm.mr.get_current_device_resource()
    if isinstance(mr, rrmm.mr.StatisticsResourceAdaptor):
        return mr
    return None


def _device_resource(device: int | None) -> Any:
    """The resource of ``device`` (the current device when None)."""
    from rrmm._snapshot import _device

    return rrmm.mr.get_per_device_resource(_device(device))


def memory_stats(device: int | None = None) -> dict[str, int]:
    """PyTorch-style counters (``torch.cuda.memory_stats`` keys, pool ``all``) of the pool behind
    ``device``'s resource (the current device when None), read through adaptors.

    Keys: ``{allocation,segment,active,allocated_bytes,reserved_bytes,active_bytes,
    requested_bytes}.all.{current,peak,allocated,freed}``, ``inactive_split{,_bytes}.all.current``,
    ``num_alloc_retries``, ``num_ooms``, ``num_device_alloc``, ``num_device_free``,
    ``num_sync_all_streams``. An empty dict when the resource has no pool (as PyTorch returns
    for an uninitialized allocator).
    """
    stats = _rrmm._memory_stats(_device_resource(device))
    return {} if stats is None else dict(sorted(stats.items()))


def reset_peak_memory_stats(device: int | None = None) -> None:
    """Sets every peak of :func:`memory_stats` to its current value."""
    _rrmm._reset_peak_memory_stats(_device_resource(device))


def enable_statistics() -> None:
    """Wraps the current device's resource in a ``StatisticsResourceAdaptor`` (once)."""
    mr = rrmm.mr.get_current_device_resource()
    if not isinstance(mr, rrmm.mr.StatisticsResourceAdaptor):
        rrmm.mr.set_current_device_resource(rrmm.mr.StatisticsResourceAdaptor(mr))


def get_statistics() -> Statistics | None:
    """The current counters, or None when the current resource does not count."""
    mr = _current_stats_mr()
    return None if mr is None else mr.allocation_counts


def push_statistics() -> Statistics | None:
    """Starts a new level of counters; returns the counters before the push (None when the
    current resource does not count)."""
    mr = _current_stats_mr()
    return None if mr is None else mr.push_counters()


def pop_statistics() -> Statistics | None:
    """Ends the top level of counters, merging it into the one below; returns the popped
    counters (None when the current resource does not count)."""
    mr = _current_stats_mr()
    return None if mr is None else mr.pop_counters()


@contextmanager
def statistics() -> Iterator[None]:
    """Counts allocations inside the block: pushes a level when statistics are enabled, else
    installs a ``StatisticsResourceAdaptor`` and removes it afterwards."""
    prior_mr = None
    if push_statistics() is None:
        prior_mr = rrmm.mr.get_current_device_resource()
        enable_statistics()
    current_mr = rrmm.mr.get_current_device_resource()
    try:
        yield
    finally:
        if current_mr is not rrmm.mr.get_current_device_resource():
            raise ValueError("RMM memory source stack was changed while in the statistics context")
        if prior_mr is None:
            pop_statistics()
        else:
            rrmm.mr.set_current_device_resource(prior_mr)


class ProfilerRecords:
    """Memory used by named functions and code blocks, recorded by ``profiler``."""

    @dataclass
    class MemoryRecord:
        """Calls, total bytes allocated and peak bytes of one name."""

        num_calls: int = 0
        memory_total: int = 0
        memory_peak: int = 0

        def add(self, memory_total: int, memory_peak: int) -> None:
            """Adds one call."""
            self.num_calls += 1
            self.memory_total += memory_total
            self.memory_peak = max(self.memory_peak, memory_peak)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, ProfilerRecords.MemoryRecord] = defaultdict(
            ProfilerRecords.MemoryRecord
        )

    def add(self, name: str, data: Statistics) -> None:
        """Records one call of ``name`` with its statistics (thread-safe)."""
        with self._lock:
            self._records[name].add(memory_total=data.total_bytes, memory_peak=data.peak_bytes)

    @property
    def records(self) -> dict[str, ProfilerRecords.MemoryRecord]:
        """A copy of the records."""
        with self._lock:
            return dict(self._records)

    def report(self, ordered_by: str = "memory_peak") -> str:
        """A table of the records, largest first by ``ordered_by``."""
        ret = "Memory Profiling\n"
        ret += "================\n\n"
        records = self.records
        if len(records) == 0:
            return ret + "No data, maybe profiling wasn't enabled?"
        ret += (
            "Legends:\n"
            "  ncalls       - number of times the function or code block was called\n"
            "  memory_peak  - peak memory allocated in function or code block (in bytes)\n"
            "  memory_total - total memory allocated in function or code block (in bytes)\n"
        )
        ret += f"\nOrdered by: {ordered_by}\n"
        ret += "\nncalls     memory_peak    memory_total  filename:lineno(function)\n"
        for name, record in sorted(
            records.items(), key=lambda x: getattr(x[1], ordered_by), reverse=True
        ):
            ret += (
                f"{record.num_calls:6,d} {record.memory_peak:15,d} "
                f"{record.memory_total:15,d}  {name}\n"
            )
        return ret[:-1]

    def __repr__(self) -> str:
        return f"ProfilerRecords({self.records!r})"


def _descriptive_name(obj: Any) -> str:
    try:
        file = inspect.getfile(obj)
        line = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        file, line = "<unknown>", 0
    return f"{file}:{line}({getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))})"


default_profiler_records = ProfilerRecords()

F = TypeVar("F", bound=Callable[..., Any])


class profiler(ContextDecorator):
    """Records the memory used by a function (decorator) or a named block (context manager)
    into ``records`` while statistics are enabled."""

    def __init__(
        self, *, records: ProfilerRecords = default_profiler_records, name: str = ""
    ) -> None:
        self._name = name
        self._records = records

    def __enter__(self) -> profiler:  # noqa: PYI034
        if not self._name:
            raise ValueError(
                "When profiler is used as a context manager, the name argument must be set"
            )
        push_statistics()
        return self

    def __exit__(self, *exc: object) -> None:
        stats = pop_statistics()
        if stats is not None:
            self._records.add(name=self._name, data=stats)

    def __call__(self, func: F) -> F:
        name = self._name or _descriptive_name(func)

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            push_statistics()
            try:
                return func(*args, **kwargs)
            finally:
                stats = pop_statistics()
                if stats is not None:
                    self._records.add(name=name, data=stats)

        return wrapper  # type: ignore[return-value]


def _get_descriptive_name_of_object(obj: object) -> str:
    """The name the profiler records ``obj`` under (``file:line(qualname)`` of the undecorated
    function), as RMM's helper of that name."""
    return _descriptive_name(inspect.unwrap(obj))  # type: ignore[arg-type]
