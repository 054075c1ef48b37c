"""Helpers of the bad-input suite, shared by its tests and the child processes they start:
one resource of each kind over a given device, the counters a resource reports, and the check
that a resource still works after a bad call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rrmm import mr

MiB = 1 << 20


def make_resources(log_path: str) -> dict[str, Callable[[Any], Any]]:
    """Makers of one resource of each kind over device ``s`` (logging writes to ``log_path``)."""

    def callback(s: Any) -> Any:
        return mr.CallbackMemoryResource(
            lambda n, stream: s.allocate(n), lambda p, n, stream: s.deallocate(p, n)
        )

    return {
        "simulated": lambda s: s,
        "system": lambda s: mr.SystemMemoryResource(),
        "pool": lambda s: mr.PoolMemoryResource(s, MiB),
        "fixed_size": lambda s: mr.FixedSizeMemoryResource(s, 4096, 4),
        "binning": lambda s: mr.BinningMemoryResource(s, 8, 12),
        "limiting": lambda s: mr.LimitingResourceAdaptor(s, 64 * MiB),
        "logging": lambda s: mr.LoggingResourceAdaptor(s, log_path),
        "statistics": lambda s: mr.StatisticsResourceAdaptor(s),
        "tracking": lambda s: mr.TrackingResourceAdaptor(s),
        "failure_callback": lambda s: mr.FailureCallbackResourceAdaptor(s, lambda n: False),
        "aligned": lambda s: mr.AlignedResourceAdaptor(s, 4096),
        "callback": callback,
        "arena": lambda s: mr.ArenaMemoryResource(s, 64 * MiB),
    }


def counters(r: Any) -> dict[str, Any]:
    """The counters a resource (and, through the chain, its upstreams) reports."""
    out: dict[str, Any] = {}
    depth = 0
    while r is not None:
        for name in ("bytes_in_use", "live_allocations", "get_allocated_bytes", "pool_size"):
            if hasattr(r, name):
                out[f"{depth}.{name}"] = getattr(r, name)()
        if isinstance(r, mr.StatisticsResourceAdaptor):
            c = r.allocation_counts
            out[f"{depth}.stats"] = (c.current_bytes, c.current_count)
        r = r.get_upstream() if isinstance(r, mr.UpstreamResourceAdaptor) else None
        depth += 1
    return out


def assert_still_works(r: Any, before: dict[str, Any]) -> None:
    """The resource allocates (256-byte aligned, distinct pointers) and frees, and its counters
    are what they were before the bad call."""
    assert counters(r) == before, (counters(r), before)
    ptrs = [r.allocate(1000) for _ in range(2)]
    assert len(set(ptrs)) == 2 and all(p % 256 == 0 for p in ptrs), ptrs
    for p in reversed(ptrs):
        r.deallocate(p, 1000)
    assert counters(r) == before, (counters(r), before)
