"""What ``rrmm.mr.FallbackResourceAdaptor.counts()`` and
``rrmm.mr.TieredMemoryResource.tier_counts()`` return, as TypedDicts. Their keys are the fields
of the Rust records ``FallbackCounts`` and ``TierCounts`` (``tests/python/test_records.py``
checks them against ``rrmm._rrmm._record_fields``)."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["FallbackCounts", "TierCounts"]


class FallbackCounts(TypedDict):
    """What went where through a fallback adaptor: allocations and bytes its upstream and its
    alternate hold now, the alternate's peak bytes, and how many allocations fell back to the
    alternate (the upstream was out of memory) or failed in both, ever."""

    upstream_allocations: int
    upstream_bytes: int
    alternate_allocations: int
    alternate_bytes: int
    alternate_peak_bytes: int
    fallbacks: int
    failures: int


class TierCounts(TypedDict):
    """One tier of a ``TieredMemoryResource`` (``rrmm::adaptor::TierCounts``): its name
    (``"device"``, ``"peer"``, ``"host"``), its resource's name, the requested bytes and
    allocations it holds now, at most at once and ever, and the allocations it passed on to the
    next tier for want of memory."""

    name: str
    resource: str
    current_bytes: int
    peak_bytes: int
    total_bytes: int
    current_allocations: int
    peak_allocations: int
    total_allocations: int
    refused: int
