"""vLLM's ``CuMemAllocator`` (``vllm.device_allocator.cumem``) over rrmm: memory allocated in
``use_memory_pool(tag)`` sleeps and wakes by tag.

    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        load_model()
    with allocator.use_memory_pool(tag="kv_cache"):
        allocate_kv_cache()
    allocator.sleep(offload_tags=("weights",))   # weights to host memory, KV cache dropped
    allocator.wake_up()                           # or wake_up(["weights"]) first

``RRMM_AS_VLLM_CUMEM=1`` makes ``vllm.device_allocator.cumem`` give this module. Each tag is an
expandable pool of its own; a sleep copies the offloaded tags at the link's speed into host
pages kept between sleeps (``rrmm.host_pages``), and returns when the device memory is free
for other processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from rrmm.compat._tag_pools import DEFAULT_TAG, PoolFactory, TagPools


class CuMemAllocator:
    """vLLM's sleep-mode allocator: one instance per process (``get_instance``)."""

    instance: CuMemAllocator | None = None
    default_tag: str = DEFAULT_TAG

    @staticmethod
    def get_instance() -> CuMemAllocator:
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self, make_pool: PoolFactory | None = None, device: int | None = None) -> None:
        self._pools = TagPools(make_pool, device)
        self.current_tag: str = CuMemAllocator.default_tag

    @contextlib.contextmanager
    def use_memory_pool(self, tag: str | None = None) -> Iterator[None]:
        """Memory allocated inside (on this thread) has ``tag`` (``default_tag`` when None)."""
        tag = CuMemAllocator.default_tag if tag is None else tag
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, not {type(tag).__name__}")
        old, self.current_tag = self.current_tag, tag
        try:
            with self._pools.region(tag, backup=True):
                yield
        finally:
            self.current_tag = old

    def _awake_tags(self) -> list[str]:
        return [t for t in self._pools.region_tags() if not self._pools.paused(t)]

    def sleep(self, offload_tags: Sequence[str] | str | None = None) -> None:
        """Gives every tag's device memory back, keeping every address: the tags in
        ``offload_tags`` (default: ``(default_tag,)``) are copied to host memory, the others
        discarded (their contents are undefined after ``wake_up``)."""
        if offload_tags is None:
            offload_tags = (CuMemAllocator.default_tag,)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        keep = set(offload_tags)
        self._pools.pause(self._awake_tags(), lambda t: t in keep)

    def discard(self, tags: Sequence[str] | str) -> None:
        """Gives ``tags``' device memory back without copying it."""
        names = [tags] if isinstance(tags, str) else list(tags)
        self._pools.pause([t for t in names if t in self._awake_tags()], lambda _: False)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Maps the memory of ``tags`` (every sleeping tag when None) again at the same
        addresses, with the offloaded contents copied back."""
        asleep = [t for t in self._pools.region_tags() if self._pools.paused(t)]
        wanted = asleep if tags is None else [t for t in tags if t in asleep]
        self._pools.resume(wanted)

    def get_current_usage(self) -> int:
        """Bytes of device memory the tags' pools hold now."""
        return self._pools.usage()


__all__ = ["CuMemAllocator"]
