"""The records ``rrmm._rrmm.replay_logs``, ``replay_allocator`` and ``fit_logs`` return, as
TypedDicts: their keys are the fields of the Rust records (``rrmm::replay::ReplayRecord``,
``FitRecord``), which cross as JSON, so they are declared once there and checked here by
mypy."""

from __future__ import annotations

from typing import TypedDict

from rrmm._counts import TierCounts

__all__ = ["FitRecord", "ReplayRecord", "TimelineColumns"]


class TimelineColumns(TypedDict):
    """The sampled timeline of a replay (``rrmm::replay::TimelineColumns``)."""

    event: list[int]
    bytes_in_use: list[int]
    footprint: list[int | None]
    beyond_device: list[int | None]


class HostPagesUsed(TypedDict):
    """The host pages a replay's resource took from the process's supply (``rrmm.host_pages``)
    during its figures pass: on a GPU, the pinned kinds and a host tier."""

    made_bytes: int
    made_ranges: int
    reused_takes: int
    held_bytes_at_end: int


class ReplayRecord(TypedDict):
    """One (log, resource) row of ``replay_logs`` (``rrmm::replay::ReplayRecord``: the keys are
    its fields). The figures are None, with ``error`` set, when the resource could not be built
    or replayed."""

    log: str
    resource: str
    driver: str
    setup: str | None
    simulated_device: bool
    events: int
    allocations: int
    logged_failures: int
    parse_warnings: int
    warning_messages: list[str]
    threads: int
    streams: int
    null_rows: int
    log_peak_bytes: int
    log_unfreed_allocations: int
    log_largest_request: int
    error: str | None
    total_ns: int | None
    ns_per_event: float | None
    ns_per_event_min: float | None
    ns_per_event_max: float | None
    ns_per_event_p25: float | None
    ns_per_event_p75: float | None
    spread: float | None
    repeats: int | None
    samples_ns: list[int] | None
    peak_bytes_in_use: int | None
    peak_footprint: int | None
    overhead: float | None
    internal_waste_at_peak: int | None
    internal_waste_at_end: int | None
    fragmentation_at_peak: float | None
    fragmentation_at_end: float | None
    footprint_at_end: int | None
    peak_beyond_device: int | None
    tiers: list[TierCounts] | None
    host_pages: HostPagesUsed | None
    sleep_releases_at_end: int | None
    sleep_copies_at_end: int | None
    sleep_releases_at_peak: int | None
    failed_allocations: int | None
    failed_bytes: int | None
    failure_events: list[int] | None
    unservable_allocations: int | None
    leaked_allocations: int | None
    leaked_bytes: int | None
    timeline: TimelineColumns | None

class FitRecord(TypedDict):
    """One (log, resource) row of ``fit_logs`` (``rrmm::replay::FitRecord``)."""

    log: str
    resource: str
    driver: str
    device_bytes: int | None
    failing_bytes: int | None
    initial_pool_size: int | None
    maximum_pool_size: int | None
    arena_size: int | None
    setup: str | None
    replays: int | None
    reason: str | None
