"""vLLM's ``CuMemAllocator`` (``vllm.device_allocator.cumem``) over rrmm: memory allocated in
``use_memory_pool(tag)`` sleeps and wakes by tag.

    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        load_model()
    with allocator.use_memory_pool(tag="kv_cache"):
        allocate_kv_cache()
    allocator.sleep(offload_tags=("weights",))   # weights to host memory, KV cache dropped
    allocator.wake_up(["weights"])                # the weights (and every tag but kv_cache)
    allocator.wake_up()                           # every tag

The calls are those of vLLM 0.33's class, call for call (``get_instance``, ``use_memory_pool``,
``cudagraph_pool``, ``sleep``, ``discard``, ``wake_up``, ``get_current_usage``,
``release_pools``, ``close``; ``instance``, ``default_tag``, ``current_tag``), and so are the
module's ``cumem_available`` and ``DEFERRABLE_TAGS``; ``tests/python/data/vllm_signatures.json``
holds that release's signatures, which the tests compare. As vLLM's: a sleep leaves a tag asleep
already as it is; a wake with ``tags`` wakes those and every sleeping tag not in
``DEFERRABLE_TAGS``; ``get_current_usage()`` counts the bytes allocated in the tags' pools,
asleep or not. Where rrmm differs: a str given to ``wake_up`` is one tag (vLLM's tests each tag
for being a substring of it), tags of the wrong type raise TypeError (vLLM's assert or nothing),
any iterable of tags is taken where vLLM takes only a tuple, and vLLM's bookkeeping attributes
(``pointer_to_data``, ``allocator_and_pools``, the C extension's callbacks) are absent: a tag's
state is its pool's.

``RRMM_AS_VLLM_CUMEM=1`` makes ``vllm.device_allocator.cumem`` give this module (so vLLM's
workers allocate from rrmm, and the sleep-mode backend ``rrmm``, ``rrmm.compat.vllm_sleep_mode``,
can move their memory). Each tag is an expandable pool of its own; a sleep copies the offloaded
tags at the link's speed into host pages kept between sleeps (``rrmm.host_pages``), and returns
when the device memory is free for other processes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from rrmm._rrmm import _memory_stats
from rrmm.compat._tag_pools import DEFAULT_TAG, PoolFactory, TagPools

#: vLLM's flag that its sleep-mode allocator can be used (vLLM: its C extension loads). rrmm's
#: is there wherever this module imports; the CUDA driver is first needed by an allocation.
cumem_available = True

#: The tags a wake with ``tags`` leaves asleep unless named (vLLM's ``DEFERRABLE_TAGS``): every
#: other sleeping tag wakes with any wake.
DEFERRABLE_TAGS: tuple[str, ...] = ("weights", "kv_cache")

#: The tag of the memory of CUDA graphs captured in ``cudagraph_pool()`` (vLLM's).
CUDAGRAPH_TAG = "cudagraph"


def _tag_names(tags: object, what: str) -> tuple[str, ...]:
    """``tags`` as tag names: a str is one tag, else an iterable of str.

    Raises TypeError for anything else."""
    if isinstance(tags, str):
        return (tags,)
    if not isinstance(tags, Iterable) or isinstance(tags, (bytes, bytearray)):
        raise TypeError(f"{what} must be a str or an iterable of str, not {type(tags).__name__}")
    names = tuple(tags)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what} must hold str tags, not {type(name).__name__} ({name!r})")
    return names


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
    def _tag_region(self, tag: str, torch_pool: bool) -> Iterator[None]:
        old, self.current_tag = self.current_tag, tag
        try:
            with self._pools.region(tag, backup=True, torch_pool=torch_pool):
                yield
        finally:
            self.current_tag = old

    @contextlib.contextmanager
    def use_memory_pool(self, tag: str | None = None) -> Iterator[None]:
        """Memory allocated inside (on this thread) has ``tag`` (``default_tag`` when None)."""
        with self._tag_region(CuMemAllocator.default_tag if tag is None else tag, True):
            yield

    @contextlib.contextmanager
    def cudagraph_pool(self) -> Iterator[Any]:
        """Memory allocated inside (on this thread: a CUDA graph's capture) has the tag
        ``"cudagraph"``; yields the tag's PyTorch ``MemPool`` id for
        ``torch.cuda.graph(pool=...)`` (None where PyTorch has no GPU)."""
        with self._tag_region(CUDAGRAPH_TAG, False):
            torch = sys.modules.get("torch")
            on_gpu = torch is not None and torch.cuda.is_available()
            yield self._pools.torch_pool_id(CUDAGRAPH_TAG) if on_gpu else None

    def asleep_tags(self) -> list[str]:
        """The tags asleep now by a sleep or discard of this process (their pools' state)."""
        return [t for t in self._pools.region_tags() if self._pools.paused(t)]

    def _awake_tags(self) -> list[str]:
        return [t for t in self._pools.region_tags() if not self._pools.paused(t)]

    def sleep(self, offload_tags: tuple[str, ...] | str | None = None) -> None:
        """Gives every awake tag's device memory back, keeping every address: the tags in
        ``offload_tags`` (default: ``(default_tag,)``) are copied to host memory, the others
        discarded (their contents are undefined after ``wake_up``). A tag asleep already stays
        as it is."""
        if offload_tags is None:
            offload_tags = (CuMemAllocator.default_tag,)
        keep = set(_tag_names(offload_tags, "offload_tags"))
        self._pools.pause(self._awake_tags(), lambda t: t in keep)

    def discard(self, tags: tuple[str, ...] | str) -> None:
        """Gives ``tags``' device memory back without copying it (awake tags only)."""
        names = set(_tag_names(tags, "tags"))
        self._pools.pause([t for t in self._awake_tags() if t in names], lambda _: False)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Maps the memory of sleeping tags again at the same addresses, with the offloaded
        contents copied back: every sleeping tag when ``tags`` is None, else those in ``tags``
        and every one not in ``DEFERRABLE_TAGS``.

        Raises MemoryError when the device has no room (nothing lost: call again)."""
        names = None if tags is None else set(_tag_names(tags, "tags"))
        self._pools.resume([t for t in self.asleep_tags()
                            if names is None or t in names or t not in DEFERRABLE_TAGS])

    def get_current_usage(self) -> int:
        """Bytes allocated in the tags' pools, asleep or not (vLLM's: its allocations' sizes)."""
        tags = self._pools.region_tags()
        if not tags:
            return 0  # before the first region: nothing made yet, and nothing to make
        tagged = self._pools.tagged()
        return sum((_memory_stats(tagged.pool(t)) or {}).get("allocated_bytes.all.current", 0)
                   for t in tags)

    def release_pools(self) -> None:
        """vLLM drops its ``MemPool``s here before the interpreter ends. rrmm keeps each tag's
        ``MemPool`` and its PyTorch allocator for the process's life (deleting a ``MemPool`` of
        a pluggable allocator aborts the process on the PyTorch rrmm was tested with), so this
        does nothing; it may be called any number of times."""

    def close(self) -> None:
        """``release_pools()`` (vLLM's alias of it)."""
        self.release_pools()


__all__ = ["CUDAGRAPH_TAG", "DEFERRABLE_TAGS", "CuMemAllocator", "cumem_available"]
