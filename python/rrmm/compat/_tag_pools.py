"""What both engine APIs share: one ``TaggedMemoryResource`` per device, set as the device's
current resource, a pool per region tag, each tag's backup choice, and PyTorch's ``MemPool`` per
tag (PyTorch's allocations in a region reach rrmm through its pluggable allocator, which
allocates from the current resource: the region's tag).

Memory allocated outside every region (and inside ``disable()``) goes to a pool of its own
(``OUTSIDE``), which no pause touches: as torch_memory_saver, a pause gives back only memory
allocated in a region. It is the tagged resource's first pool (what a thread with no current tag
allocates from) unless the process is in a region from the start (``first_tag``: torch_memory_saver's
``TMS_INIT_ENABLE``), when that region's pool is first. Whether a tag is paused is its pool's own
state (``pool.asleep``, ``pool.movement()``); nothing here keeps a copy of it. A pool whose tag
keeps its bytes at a pause keeps its next pause's host pages ready as it grows
(``keep_sleep_ready``), so the first pause copies at the link's speed too."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from rrmm import mr, shared_gpu

DEFAULT_TAG = "default"
#: The pool of memory allocated outside every region: never paused, not a region's tag.
OUTSIDE = "rrmm:outside-regions"

PoolFactory = Callable[[], mr.ExpandableMemoryResource]

#: Every PyTorch ``MemPool`` made here, kept for the life of the process: deleting a MemPool
#: whose allocator is pluggable aborts the process on the PyTorch this was tested with (2.11),
#: and a ``TagPools`` (a saver, an allocator) can be garbage-collected before the process ends.
_MEM_POOLS_KEPT: list[Any] = []


def _keep_forever(mem_pool: Any) -> None:
    """Keeps ``mem_pool`` past the interpreter's end: a reference Python never drops, so no
    MemPool destructor runs at exit either (there it frees its cached blocks through rrmm's
    allocator, whose resources ``reinitialize`` or the saver's end may have dropped: PyTorch
    then aborts the process on a pointer its pluggable allocator no longer knows)."""
    import ctypes

    _MEM_POOLS_KEPT.append(mem_pool)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(mem_pool))


class TagPools:
    """Each tag's expandable pool on one device, and what a pause of it keeps."""

    def __init__(
        self,
        make_pool: PoolFactory | None = None,
        device: int | None = None,
        first_tag: str | None = None,
        first_backup: bool = False,
        on_new_pool: Callable[[str, mr.ExpandableMemoryResource], None] | None = None,
    ) -> None:
        """``first_tag``: a region the whole process is in from the start (every thread with
        no current tag allocates there, ``first_backup`` saying whether a pause keeps its
        bytes); ``on_new_pool(tag, pool)``: called for each tag's pool as it is made (after
        it was set to keep its next pause's host pages ready where the tag keeps its bytes)."""
        self._make_pool = make_pool
        self._device = device
        self._first = first_tag
        self._lock = threading.RLock()
        self._tagged: mr.TaggedMemoryResource | None = None
        self._backup: dict[str, bool] = {}
        self._entered: list[str] = []
        self._torch_pools: dict[str, list[Any]] = {}
        self._mem_pools_in_use: set[int] = set()
        #: Each paused tag's mapped bytes at its pause (mapped again at its wake).
        self._footprints: dict[str, int] = {}
        self._no_mem_pools = False
        self._on_new_pool = on_new_pool
        if first_tag is not None:
            self._backup[first_tag] = first_backup

    # ---------------------------------------------------------------- set-up

    def _device_ordinal(self) -> int:
        if self._device is None:
            from rrmm._rrmm import _current_device

            self._device = _current_device()
        return self._device

    def _new_pool(self) -> mr.ExpandableMemoryResource:
        if self._make_pool is not None:
            return self._make_pool()
        return mr.ExpandableMemoryResource(device=self._device_ordinal())

    def tagged(self) -> mr.TaggedMemoryResource:
        """The tagged resource, made and set as the device's current resource on first use; its
        first pool takes what is allocated outside every region (``OUTSIDE``), or, when the
        process is in a region from the start, that region's."""
        with self._lock:
            if self._tagged is None:
                first = OUTSIDE if self._first is None else self._first
                tagged = mr.TaggedMemoryResource(self._new_tag_pool(first), first)
                if self._first is not None:
                    tagged.add_tag(OUTSIDE, self._new_tag_pool(OUTSIDE))
                    self._entered.append(self._first)
                self._tagged = tagged
                mr.set_per_device_resource(self._device_ordinal(), tagged)
            return self._tagged

    def _new_tag_pool(self, tag: str) -> mr.ExpandableMemoryResource:
        pool = self._new_pool()
        if tag != OUTSIDE and self.backup(tag):
            # The next pause's host pages, made ready in the background as the pool grows.
            pool.keep_sleep_ready(True)
        if self._on_new_pool is not None and tag != OUTSIDE:
            self._on_new_pool(tag, pool)
        return pool

    def _ensure_tag(self, tag: str, backup: bool) -> None:
        if tag == OUTSIDE:
            raise ValueError(f"{OUTSIDE!r} names the memory outside every region, not a region")
        tagged = self.tagged()
        with self._lock:
            self._backup[tag] = backup
            if tag not in tagged.tags:
                tagged.add_tag(tag, self._new_tag_pool(tag))

    # ---------------------------------------------------------------- regions

    @contextlib.contextmanager
    def region(self, tag: str, backup: bool, torch_pool: bool = True) -> Iterator[None]:
        """Allocations of this thread inside go to ``tag``'s pool (PyTorch's through a
        ``MemPool`` of the tag, when PyTorch is loaded)."""
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, not {type(tag).__name__}")
        self._ensure_tag(tag, backup)
        tagged = self.tagged()
        with self._lock:
            if tag not in self._entered:
                self._entered.append(tag)
        previous = tagged.set_current_tag(tag)
        try:
            with self.torch_mem_pool(tag) if torch_pool else contextlib.nullcontext():
                yield
        finally:
            tagged.set_current_tag(previous)

    def _mem_pool(self, tag: str, take: bool) -> Any:
        """A PyTorch ``MemPool`` of ``tag`` over rrmm's PyTorch allocator: with ``take``, one no
        other region is in now (made when all are), marked in use; else the tag's first. None
        where PyTorch is not loaded, has no GPU, or makes no MemPool (rrmm's allocator is
        PyTorch's own, ``TMS_INIT_ENABLE``: its allocations reach rrmm's current tag without
        one). A MemPool is never in two threads' regions at once: PyTorch's end of one
        thread's allocation to a pool can end another's."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or self._no_mem_pools:
            return None
        from rrmm.allocators.torch import rmm_torch_allocator

        with self._lock:
            pools = self._torch_pools.setdefault(tag, [])
            free = [p for p in pools if id(p) not in self._mem_pools_in_use]
            if not take and pools:
                return pools[0]
            if take and free:
                self._mem_pools_in_use.add(id(free[0]))
                return free[0]
            try:
                pool = torch.cuda.MemPool(rmm_torch_allocator.allocator())
            except RuntimeError as e:
                if "pluggable" not in str(e):
                    raise
                self._no_mem_pools = True
                return None
            pools.append(pool)
            _keep_forever(pool)
            if take:
                self._mem_pools_in_use.add(id(pool))
        return pool

    @contextlib.contextmanager
    def torch_mem_pool(self, tag: str) -> Iterator[None]:
        """``torch.cuda.use_mem_pool`` of a MemPool of ``tag`` over rrmm's PyTorch allocator
        (this thread's alone while inside); nothing where there is none (``_mem_pool``)."""
        pool = self._mem_pool(tag, take=True)
        if pool is None:
            yield
            return
        try:
            with sys.modules["torch"].cuda.use_mem_pool(pool):
                yield
        finally:
            with self._lock:
                self._mem_pools_in_use.discard(id(pool))

    def torch_pool_id(self, tag: str) -> Any:
        """The id of ``tag``'s first PyTorch ``MemPool`` (for ``torch.cuda.graph(pool=...)``);
        None where there is none (PyTorch then gives the graph a private pool)."""
        pool = self._mem_pool(tag, take=False)
        return None if pool is None else pool.id

    # ---------------------------------------------------------------- sleep

    def region_tags(self) -> list[str]:
        """The tags a region has used, in the order first used."""
        with self._lock:
            return list(self._entered)

    def _synchronize(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()

    def pause(
        self,
        tags: list[str],
        keep: Callable[[str], bool],
        to_disk: Callable[[str], tuple[str, int | None] | None] | None = None,
    ) -> dict[str, Any]:
        """Gives the physical memory of ``tags``' pools (region tags) back, keeping every
        address; a tag for which ``keep`` is false is discarded (not copied); one for which
        ``to_disk`` gives a directory (and chunk bytes) is written to files there instead of
        host memory. Returns each tag's figures. Memory outside every region is never touched.
        A refused pause changes nothing: the tags it paused before the refusal are resumed and
        the error raised."""
        tagged = self.tagged()
        self._synchronize()
        done: dict[str, Any] = {}
        for tag in tags:
            if tag == OUTSIDE:
                continue
            pool = tagged.pool(tag)
            footprint = pool.mapped_bytes()
            discard: Any = None if keep(tag) else "all"
            disk = to_disk(tag) if to_disk is not None and keep(tag) else None
            try:
                if disk is None:
                    done[tag] = pool.offload(discard=discard)
                else:
                    done[tag] = pool.offload(to_disk=disk[0], disk_chunk_bytes=disk[1])
            except BaseException:
                for paused in done:
                    tagged.pool(paused).restore()
                raise
            with self._lock:
                self._footprints[tag] = footprint
        # An engine between phases is idle: on a shared GPU its other pools may sleep too.
        shared_gpu._engine_idle(True)
        return done

    def resume(self, tags: list[str]) -> None:
        """Maps ``tags``' pools again at the same addresses and copies their backups back. A
        tag that cannot wake (no room; a disk backup's file gone) stays paused with its bytes;
        the others are still resumed, and the first error is raised."""
        tagged = self.tagged()
        shared_gpu._engine_idle(False)
        first: BaseException | None = None
        for tag in tags:
            if self.paused(tag):
                try:
                    tagged.pool(tag).restore()
                except (MemoryError, RuntimeError, ValueError) as e:
                    first = first or e
                    continue
                self._map_footprint(tag)
        if first is not None:
            raise first

    def _map_footprint(self, tag: str) -> None:
        """After ``tag``'s wake: its pool maps as much device memory as it held at the pause.
        A pause gives back the pool's free pages too, and a wake maps only the pages with
        data; the engines' allocators map back everything a pause took (PyTorch's cached
        segments with the rest), and an engine sizes its next steps by that: the free pages
        are mapped again (``map_to``; best effort: when the device has no room now, the pool
        grows as it is used instead)."""
        with self._lock:
            footprint = self._footprints.pop(tag, 0)
        with contextlib.suppress(MemoryError):
            self.tagged().pool(tag).map_to(footprint)

    def paused(self, tag: str) -> bool:
        """Whether ``tag``'s pool sleeps by the process's own choice now (its own state). A pool
        the shared GPU's ledger put to sleep while the process was idle is not paused: it wakes
        when used, and a pause of it makes the sleep the engine's."""
        if self._tagged is None or tag not in self._tagged.tags:
            return False
        states = self._tagged.pool(tag).movement()
        return any(m["cause"] == "user" for m in states)

    def backup(self, tag: str) -> bool:
        return self._backup.get(tag, True)

    def usage(self) -> int:
        """Bytes the region tags' pools hold on the device now."""
        if self._tagged is None:
            return 0
        total = 0
        for tag in self.region_tags():
            total += sum(int(m["device_bytes"]) for m in self._tagged.pool(tag).movement())
        return total
