"""The dicts of memory that moves as TypedDicts: sleep and wake (``offload()``,
``sleep_estimate()``, ``last_sleep()``), spilling (``promote()``, ``spill_figures()``), the
movement state (``movement()``) and the host page supply (``rrmm.host_pages.figures()``). Their
keys are the fields of the Rust records ``SleepEstimate``, ``SleepReport``, ``PromoteReport``,
``SpillFigures``, ``Movement`` and ``SupplyFigures`` (``tests/python/test_records.py`` checks
them against ``rrmm._rrmm._record_fields``)."""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "HostPageFigures",
    "Movement",
    "PromoteReport",
    "SleepFigures",
    "SleepReport",
    "SpillFigures",
]


class SleepFigures(TypedDict):
    """What a sleep released and copied (or would, from ``sleep_estimate()``), in bytes."""

    released_bytes: int
    copied_bytes: int
    discarded_bytes: int
    free_page_bytes: int
    cached_free_bytes: int
    live_blocks: int


class SleepReport(SleepFigures):
    """The latest sleep of an expandable pool: its figures and where the time went (seconds;
    the restore's are None until a restore succeeded)."""

    sleeps: int
    host_bytes: int
    host_pinned: bool
    host_reused: bool
    host_ranges: int
    offload_s: float
    sync_trim_s: float
    host_alloc_s: float
    copy_out_s: float
    unmap_s: float
    restore_s: float | None
    map_s: float | None
    copy_in_s: float | None
    failed_restores: int
    disk_bytes: int


class HostPageFigures(TypedDict):
    """What the process's host page supply holds and has done (``rrmm.host_pages.figures()``)."""

    free_bytes: int
    free_ranges: int
    leased_bytes: int
    preparing_bytes: int
    made_ranges: int
    made_bytes: int
    reused: int
    made_on_take: int
    given_back_bytes: int
    keep_limit: int | None
    largest_leased: int
    ready_target: int


class PromoteReport(TypedDict):
    """What ``promote()`` did: bytes moved from host pages to device memory at the same
    addresses, bytes still on the host, free bytes unmapped first, its seconds and those of
    them spent synchronizing and unmapping free pages (``trim_s``)."""

    promoted: int
    spilled: int
    trimmed: int
    seconds: float
    trim_s: float


class SpillFigures(TypedDict):
    """The host pages an expandable pool spills to (``spill_figures()``), in bytes."""

    limit: int
    spilled: int
    kept: int
    made: int
    #: Of ``made``, bytes made ahead in the background as the device filled.
    made_ahead: int
    reused: int
    promoted: int
    promote_make_s: float
    promote_copy_s: float
    promote_remap_s: float
    #: Of ``promoted``, bytes moved into device pages the pool had free (none made for them).
    promote_reused: int


class Movement(TypedDict):
    """A pool's movement state (``movement()``): its phase (``"awake"``, ``"offloading"``,
    ``"asleep"``, ``"waking"``), who put it to sleep (``"user"``, ``"ledger"``, or None while
    awake), and where its bytes are: device pages, host pages spilled under its addresses
    (they stay there across a sleep), the host copy (or disk backup) of a sleep, and bytes
    moving now; and how many times the physical memory behind its addresses changed (every
    sleep, wake and promotion that moved pages: code that registered the memory with another
    library compares it with the count it registered at)."""

    phase: str
    cause: str | None
    device_bytes: int
    spilled_bytes: int
    offloaded_bytes: int
    moving_bytes: int
    backing_changes: int
