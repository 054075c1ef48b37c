"""What ``rrmm.mr.FallbackResourceAdaptor.counts()`` returns, as a TypedDict."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["FallbackCounts"]


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
