"""torch_memory_saver's API over rrmm: tensors made in a ``region`` can be paused (their
physical memory given back, every address kept) and resumed.

    from rrmm.compat.torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="kv_cache"):
        cache = torch.empty(n, device="cuda")
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.randn(m, device="cuda")
    torch_memory_saver.pause("kv_cache")   # dropped: its contents are undefined after resume
    torch_memory_saver.pause("weights")    # backed up to host memory
    torch_memory_saver.resume()            # every paused tag

The calls and their arguments are torch_memory_saver's (``region``, ``cuda_graph``,
``disable``, ``pause``, ``resume``, ``enabled``, the ``hook_mode`` and
``memory_margin_bytes`` setters, ``configure_subprocess``); ``RRMM_AS_TORCH_MEMORY_SAVER=1``
makes ``import torch_memory_saver`` give this module. What differs: no ``LD_PRELOAD`` (rrmm's
PyTorch allocator serves the regions through a ``MemPool`` per tag), each tag is an expandable
pool of its own (a pause of one tag leaves the others allocating), and a backup copies at the
link's speed into host pages kept between pauses.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from rrmm.compat._tag_pools import DEFAULT_TAG, PoolFactory, TagPools

_TAG_DEFAULT = DEFAULT_TAG


class TorchMemorySaver:
    """torch_memory_saver's singleton class (the module's ``torch_memory_saver``)."""

    def __init__(self, make_pool: PoolFactory | None = None, device: int | None = None) -> None:
        self._pools = TagPools(make_pool, device)
        self._region_depth = 0
        self._disabled_pools: list[Any] = []

    @contextlib.contextmanager
    def region(
        self,
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> Iterator[None]:
        """Memory allocated inside (on this thread) can be paused with ``tag``;
        ``enable_cpu_backup``: a pause copies it to host memory (else its contents are
        undefined after ``resume``). ``cpu_backup_backend`` ("pinned" or "mmap") is accepted:
        rrmm's backup is always pinned pages of its host page supply, kept between pauses.
        ``enable_disk_backup`` is not offered (NotImplementedError)."""
        if cpu_backup_backend not in (None, "pinned", "mmap"):
            raise ValueError(
                f"cpu_backup_backend must be 'pinned', 'mmap' or None, not {cpu_backup_backend!r}")
        if cpu_backup_backend is not None and not enable_cpu_backup:
            raise ValueError("cpu_backup_backend needs enable_cpu_backup=True")
        if enable_disk_backup:
            if enable_cpu_backup:
                raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
            raise NotImplementedError(
                "rrmm.compat.torch_memory_saver: disk backup is not offered; use "
                "enable_cpu_backup=True (host memory at the link's speed)")
        if self._region_depth:
            raise RuntimeError("torch_memory_saver: region() inside a region() is not allowed")
        self._region_depth += 1
        try:
            with self._pools.region(tag, enable_cpu_backup):
                yield
        finally:
            self._region_depth -= 1

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph: Any,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
    ) -> Iterator[None]:
        """``torch.cuda.graph(...)`` whose memory (the graph's intermediate tensors) can be
        paused with ``tag``: the capture allocates from the tag's pool."""
        import torch

        with self._pools.region(tag, enable_cpu_backup, torch_pool=False):
            pool = self._pools.torch_pool_id(tag) if pool is None else pool
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                                  capture_error_mode=capture_error_mode):
                yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Inside a region: allocations go outside it (not pauseable) until the block ends."""
        tagged = self._pools.tagged()
        previous = tagged.set_current_tag(None)
        try:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                # A pool of its own, so PyTorch's cache never hands these blocks to a region.
                # Kept alive with the saver: deleting a MemPool whose allocator is pluggable
                # aborts the process on the PyTorch this was tested with.
                pool = torch.cuda.MemPool()
                self._disabled_pools.append(pool)
                with torch.cuda.use_mem_pool(pool):
                    yield
            else:
                yield
        finally:
            tagged.set_current_tag(previous)

    def _tags(self, tag: str | None, want_paused: bool) -> list[str]:
        known = self._pools.region_tags()
        if tag is not None:
            if tag not in known or self._pools.paused(tag) == want_paused:
                state = "paused" if want_paused else "active"
                raise RuntimeError(
                    f"torch_memory_saver: no {state} allocations for tag {tag!r} "
                    f"(tags: {known})")
            return [tag]
        return [t for t in known if self._pools.paused(t) != want_paused]

    def pause(self, tag: str | None = None) -> None:
        """Gives the physical memory of ``tag``'s regions back (every tag's when None), keeping
        every address; backed up to host memory where the region asked."""
        self._pools.pause(self._tags(tag, want_paused=True), self._pools.backup)

    def resume(self, tag: str | None = None) -> None:
        """Maps ``tag``'s memory again (every paused tag's when None) at the same addresses,
        with its backup copied back."""
        self._pools.resume(self._tags(tag, want_paused=False))

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> str:
        raise AttributeError("hook_mode can only be set (rrmm needs no hook)")

    @hook_mode.setter
    def hook_mode(self, hook_mode: str) -> None:
        """Accepted and ignored: rrmm serves regions through PyTorch's MemPool, with no
        preloaded library."""

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("memory_margin_bytes can only be set")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        """Accepted: rrmm's resume fails cleanly (MemoryError, nothing lost, call again) when
        the device has no room, so no margin is kept."""
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"memory_margin_bytes must be a non-negative int, not {value!r}")

    def get_cpu_backup(self, x: Any) -> Any:
        raise NotImplementedError(
            "rrmm.compat.torch_memory_saver: the backup is rrmm's (host pages of the process's "
            "supply) and is not exposed as a tensor")


torch_memory_saver = TorchMemorySaver()


def region(tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False) -> Any:
    """``torch_memory_saver.region`` of the singleton."""
    return torch_memory_saver.region(tag=tag, enable_cpu_backup=enable_cpu_backup)


def pause(tag: str | None = None) -> None:
    """``torch_memory_saver.pause`` of the singleton."""
    torch_memory_saver.pause(tag)


def resume(tag: str | None = None) -> None:
    """``torch_memory_saver.resume`` of the singleton."""
    torch_memory_saver.resume(tag)


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """torch_memory_saver sets ``LD_PRELOAD`` for child processes here; rrmm needs none."""
    yield


__all__ = ["TorchMemorySaver", "configure_subprocess", "pause", "region", "resume",
           "torch_memory_saver"]
