"""torch_memory_saver 0.0.10's API over rrmm: tensors made in a ``region`` can be paused (their
physical memory given back, every address kept) and resumed.

    from rrmm.compat.torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="kv_cache"):
        cache = torch.empty(n, device="cuda")
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.randn(m, device="cuda")
    torch_memory_saver.pause("kv_cache")   # dropped: its contents are undefined after resume
    torch_memory_saver.pause("weights")    # backed up to host memory
    torch_memory_saver.resume()            # every paused tag

Every public name, call, keyword and environment variable of torch_memory_saver 0.0.10, with
its meaning there:

- ``torch_memory_saver`` (the process's saver), ``TorchMemorySaver``, ``configure_subprocess``
  (rrmm adds module-level ``region``, ``pause`` and ``resume`` of the singleton).
- ``region(tag="default", enable_cpu_backup=False, enable_disk_backup=False,
  cpu_backup_backend=None)``: memory allocated inside, on this thread, has ``tag``. Regions are
  per thread: other threads' regions run at the same time, and a region inside a region of the
  same thread has its own tag and backup until it ends (the outer one's come back).
- ``cuda_graph(cuda_graph, pool=None, stream=None, capture_error_mode="global", tag="default",
  enable_cpu_backup=False, cpu_backup_backend=None)``, ``disable()``.
- ``pause(tag=None)``, ``resume(tag=None)``: one tag's memory or every tag's. A tag that no
  region used is nothing to pause or resume (no error, as torch_memory_saver); pausing a tag that
  is paused already, or resuming one that is not paused, is a ``RuntimeError`` (torch_memory_saver
  exits the process). A refused pause (``MemoryError``: no room on the host or the disk;
  ``ValueError``: the disk backup directory cannot be made) changes nothing; a refused resume
  leaves that tag paused with its backup (files included) and resumes the others.
- ``retain_cpu_backup`` (``TMS_RETAIN_CPU_BACKUP=1``): off (the default), a resume gives the
  backup's host memory back to the OS; on, the backup stays with its memory after the resume:
  ``get_cpu_backup`` still reads it (as of the pause), and the next pause copies into the same
  host pages. Consulted at each resume: turning it off frees nothing until the next resume.
- ``get_cpu_backup(x, zero_copy=False)``: the backup of tensor ``x`` (contiguous) as a CPU
  tensor of its dtype and shape, a clone (or, with ``zero_copy``, a view of the backup itself,
  valid until the resume gives it back); ``None`` when there is none (not paused and not
  retained, no CPU backup, a disk backup). Other buffers (CuPy arrays, ``rrmm.DeviceBuffer``)
  give a NumPy ``uint8`` array.
- ``cpu_backup_backend``: ``"pinned"`` (the default, or ``TMS_INIT_CPU_BACKUP_BACKEND``): the
  backup is page-locked host memory of rrmm's host page supply, copied at the link's speed, and
  made ready while the region grows so the first pause is fast too. ``"mmap"``: plain pageable
  pages made at the pause and given back to the OS at a non-retaining resume (nothing held
  while awake: the process's resident memory grows by the backup at the pause and shrinks
  again at the resume), copied at the pageable speed.
- Disk backup: ``region(enable_disk_backup=True)`` (or ``TMS_INIT_ENABLE_DISK_BACKUP=1``), the
  directory ``set_disk_backup_dir(path)`` or ``TMS_DISK_BACKUP_DIR`` (default ``/tmp``; made if
  missing), chunks ``TMS_DISK_BACKUP_CHUNK_MB`` (default 256 MiB, 0 too, as there): a pause writes the tag's
  live bytes to one file per live block there, streamed through two pinned chunks, and gives
  the host memory back (the files' pages are dropped from the page cache); the resume reads
  them back into the same addresses and removes them. A file that vanished or shrank before
  the resume is a ``RuntimeError`` and the tag stays paused with its files.
- ``TMS_INIT_ENABLE=1`` (with ``TMS_INIT_ENABLE_CPU_BACKUP=1`` or
  ``TMS_INIT_ENABLE_DISK_BACKUP=1``): every allocation of the process is in a region of tag
  ``"default"`` from the start (as training engines run), so ``pause()`` pauses it; ``disable()``
  and other tags' regions still work inside. With PyTorch and a GPU, rrmm's allocator becomes
  PyTorch's when the saver starts (before PyTorch's first CUDA allocation).
- ``hook_mode`` (``"preload"`` or ``"torch"``) and ``memory_margin_bytes`` are accepted (set
  only, as there); ``enabled`` is True.

What differs: no ``LD_PRELOAD`` in either hook mode (rrmm's PyTorch allocator serves the regions
through a ``MemPool`` per tag, so memory that other libraries allocate with ``cudaMalloc`` is
not in a region); each tag and backup kind is an expandable pool of its own (a pause of one tag
leaves the others allocating); a pause copies a whole tag at the link's speed; and rrmm keeps no
margin (a resume without room fails cleanly instead: ``MemoryError``, nothing lost, call again).
torch_memory_saver 0.0.10 offers no way to register a hook mode (its table of modes is fixed),
so rrmm takes its place by import alias: ``RRMM_AS_TORCH_MEMORY_SAVER=1`` makes
``import torch_memory_saver`` give this module (``configure_subprocess()`` sets it for child
processes).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Literal

from rrmm.compat._tag_pools import DEFAULT_TAG, OUTSIDE, PoolFactory, TagPools

_TAG_DEFAULT = DEFAULT_TAG
CpuBackupBackend = Literal["mmap", "pinned"]
HookMode = Literal["preload", "torch"]

#: What a region's memory keeps at a pause: each is a pool of its own per tag.
_NONE, _PINNED, _MMAP, _DISK = "no backup", "pinned", "mmap", "disk"


def _env_flag(name: str) -> bool:
    """A boolean variable as torch_memory_saver reads it (unset or empty: False)."""
    value = os.environ.get(name)
    if not value or value in ("0", "false", "FALSE", "no", "NO"):
        return False
    if value in ("1", "true", "TRUE", "yes", "YES"):
        return True
    raise ValueError(f"{name}={value!r}: use 1, true, yes or 0, false, no")


def _backend(value: str | None, where: str) -> str:
    if value in (None, ""):
        return _PINNED
    if value not in (_PINNED, _MMAP):
        raise ValueError(f"{where} must be 'pinned' or 'mmap', not {value!r}")
    return value


class _Config:
    """What the environment says, read when the saver starts (as torch_memory_saver reads it
    when its library loads)."""

    def __init__(self) -> None:
        self.backend = _backend(os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND"),
                                "TMS_INIT_CPU_BACKUP_BACKEND")
        self.retain = _env_flag("TMS_RETAIN_CPU_BACKUP")
        self.disk_dir = os.environ.get("TMS_DISK_BACKUP_DIR") or "/tmp"
        # torch_memory_saver's default, taken for 0 too (its reads and writes of 256 MiB).
        chunk_mb = int(os.environ.get("TMS_DISK_BACKUP_CHUNK_MB") or 0) or 256
        self.disk_chunk_bytes: int = chunk_mb << 20
        self.init: str | None = None
        if _env_flag("TMS_INIT_ENABLE"):
            cpu, disk = _env_flag("TMS_INIT_ENABLE_CPU_BACKUP"), _env_flag(
                "TMS_INIT_ENABLE_DISK_BACKUP")
            if cpu and disk:
                raise ValueError("TMS_INIT_ENABLE_CPU_BACKUP and TMS_INIT_ENABLE_DISK_BACKUP "
                                 "are mutually exclusive")
            self.init = _DISK if disk else self.backend if cpu else _NONE


class TorchMemorySaver:
    """torch_memory_saver's saver (the module's ``torch_memory_saver`` is the process's).
    ``make_pool`` and ``device`` are rrmm's: the expandable pool each tag gets (default: one on
    the device) and the device (default: the current one)."""

    def __init__(self, make_pool: PoolFactory | None = None, device: int | None = None) -> None:
        self._make_pool = make_pool
        self._device = device
        self._lock = threading.RLock()
        self._pools: TagPools | None = None
        self._config: _Config | None = None
        #: Each (tag, backup kind)'s pool name: the tag itself for the first kind it is used
        #: with, then "tag [kind]" (a name registry; the pools own their state).
        self._names: dict[tuple[str, str], str] = {}
        self._kinds: dict[str, str] = {}

    # ------------------------------------------------------------------ start

    def _ensure_initialized(self) -> TagPools:
        """Starts the saver (as torch_memory_saver's): reads the environment, makes the tagged
        resource the device's, and with ``TMS_INIT_ENABLE`` puts the process in a region."""
        with self._lock:
            if self._pools is not None:
                return self._pools
            config = _Config()
            first = None
            if config.init is not None:
                first = self._name(_TAG_DEFAULT, config.init)
            self._config = config
            pools = TagPools(self._make_pool, self._device, first_tag=first,
                             first_backup=config.init not in (None, _NONE),
                             on_new_pool=self._configure)
            pools.tagged()
            if first is not None:
                _torch_allocations_through_rrmm()
            self._pools = pools
            return pools

    def _settings(self) -> _Config:
        self._ensure_initialized()
        assert self._config is not None
        return self._config

    def _name(self, tag: str, kind: str) -> str:
        with self._lock:
            name = self._names.get((tag, kind))
            if name is None:
                name = tag if tag not in self._kinds else f"{tag} [{kind}]"
                while name in self._kinds:
                    name += "'"
                self._names[(tag, kind)] = name
                self._kinds[name] = kind
            return name

    def _configure(self, name: str, pool: Any) -> None:
        """A new pool's settings for its backup kind (before anything is allocated)."""
        kind = self._kinds.get(name, _NONE)
        if kind in (_MMAP, _DISK):
            # Reclaimable (mmap): pages made at the pause and given back at the resume, none
            # held ahead while the region is awake. A disk backup writes through one small
            # staging range (two chunks): pinned pages made ahead for it would only be held.
            pool.keep_sleep_ready(False)
        if kind in (_PINNED, _MMAP):
            pool.set_pageable_host_copy(kind == _MMAP)
            retain = self._config is not None and self._config.retain
            pool.set_host_copy_after_wake("keep" if retain else "give_back")

    def _kind(self, enable_cpu_backup: bool, enable_disk_backup: bool,
              cpu_backup_backend: str | None) -> str:
        if cpu_backup_backend is not None:
            _backend(cpu_backup_backend, "cpu_backup_backend")
            if not enable_cpu_backup:
                raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if enable_cpu_backup and enable_disk_backup:
            raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
        if enable_disk_backup:
            return _DISK
        if enable_cpu_backup:
            return cpu_backup_backend or self._settings().backend
        return _NONE

    # ------------------------------------------------------------------ regions

    @contextlib.contextmanager
    def region(
        self,
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        enable_disk_backup: bool = False,
        cpu_backup_backend: CpuBackupBackend | None = None,
    ) -> Iterator[None]:
        """Memory allocated inside (on this thread) can be paused with ``tag``;
        ``enable_cpu_backup``: a pause copies it to host memory (``cpu_backup_backend``:
        ``"pinned"`` or ``"mmap"``, see the module), ``enable_disk_backup``: to files (else its
        contents are undefined after ``resume``). Regions nest (the inner one's tag and backup
        until it ends) and are per thread."""
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, not {type(tag).__name__}")
        kind = self._kind(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        pools = self._ensure_initialized()
        with pools.region(self._name(tag, kind), kind != _NONE):
            yield

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph: Any,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        cpu_backup_backend: CpuBackupBackend | None = None,
    ) -> Iterator[None]:
        """``torch.cuda.graph(...)`` whose memory (the graph's intermediate tensors) can be
        paused with ``tag``: the capture allocates from the tag's pool."""
        import torch

        kind = self._kind(enable_cpu_backup, False, cpu_backup_backend)
        pools = self._ensure_initialized()
        name = self._name(tag, kind)
        with pools.region(name, kind != _NONE, torch_pool=False):
            pool = pools.torch_pool_id(name) if pool is None else pool
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                                  capture_error_mode=capture_error_mode):
                yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Inside a region: allocations go outside every region (never paused) until the block
        ends."""
        pools = self._ensure_initialized()
        tagged = pools.tagged()
        previous = tagged.set_current_tag(OUTSIDE)
        try:
            # PyTorch's allocations go through rrmm's allocator to the outside pool, in a
            # MemPool of its own (one, reused), so PyTorch's cache never hands these blocks to
            # a region. Never the current allocator's MemPool(): with TMS_INIT_ENABLE that is
            # rrmm's pluggable allocator, for which PyTorch makes no pool without it named.
            with pools.torch_mem_pool(OUTSIDE):
                yield
            # What the block freed goes back to the device (torch_memory_saver's disable()
            # leaves no memory behind it): the outside pool's free pages are unmapped.
            with contextlib.suppress(KeyError):
                tagged.pool(OUTSIDE).trim()
        finally:
            tagged.set_current_tag(previous)

    # ------------------------------------------------------------------ pause and resume

    def _pools_of(self, tag: str | None) -> list[str]:
        """The pool names of ``tag``'s regions (every region's when None)."""
        names = self._ensure_initialized().region_tags()
        if tag is None:
            return names
        with self._lock:
            mine = {name for (t, _), name in self._names.items() if t == tag}
        return [n for n in names if n in mine]

    def pause(self, tag: str | None = None) -> None:
        """Gives the physical memory of ``tag``'s regions back (every tag's when None),
        keeping every address; backed up to host memory or files where the region asked. A
        refused pause changes nothing."""
        pools = self._ensure_initialized()
        names = self._pools_of(tag)
        awake = [n for n in names if not pools.paused(n)]
        if tag is not None and names and not awake:
            raise RuntimeError(f"torch_memory_saver: pause({tag!r}): the tag is paused already; "
                               f"resume({tag!r}) first")
        settings = self._settings()
        disk_dir = settings.disk_dir
        if any(self._kinds.get(n) == _DISK for n in awake):
            _make_dir(disk_dir)

        def to_disk(name: str) -> tuple[str, int | None] | None:
            if self._kinds.get(name) != _DISK:
                return None
            return disk_dir, settings.disk_chunk_bytes

        pools.pause(awake, lambda n: self._kinds.get(n, _NONE) != _NONE, to_disk)

    def resume(self, tag: str | None = None) -> None:
        """Maps ``tag``'s memory again (every paused tag's when None) at the same addresses,
        with its backup copied back. A tag that cannot wake stays paused with its backup."""
        pools = self._ensure_initialized()
        names = self._pools_of(tag)
        paused = [n for n in names if pools.paused(n)]
        if tag is not None and names and not paused:
            raise RuntimeError(f"torch_memory_saver: resume({tag!r}): the tag is not paused; "
                               f"pause({tag!r}) first")
        pools.resume(paused)

    # ------------------------------------------------------------------ backups

    @property
    def retain_cpu_backup(self) -> bool:
        """Whether a resume keeps the CPU backups with their memory (see the module)."""
        return self._settings().retain

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        settings = self._settings()
        settings.retain = bool(value)
        pools = self._ensure_initialized()
        tagged = pools.tagged()
        for name in pools.region_tags():
            if self._kinds.get(name) in (_PINNED, _MMAP):
                tagged.pool(name).set_host_copy_after_wake("keep" if value else "give_back")

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        """The CPU backup of ``x`` (see the module): a CPU tensor for a tensor, a NumPy
        ``uint8`` array for another buffer; ``None`` when there is none."""
        pools = self._ensure_initialized()
        torch = sys.modules.get("torch")
        is_tensor = torch is not None and isinstance(x, torch.Tensor)
        if is_tensor and not x.is_contiguous():
            raise ValueError(f"get_cpu_backup needs a contiguous tensor ({x.shape=}, "
                             f"{x.stride()=})")
        nbytes = int(x.nbytes) if is_tensor else None
        tagged = pools.tagged()
        for name in pools.region_tags():
            pool = tagged.pool(name)
            spans = pool.host_copy_of(x, nbytes)
            if spans is None:
                continue
            buf: Any
            if zero_copy and len(spans) == 1:
                addr, n = spans[0]
                buf = (ctypes.c_uint8 * n).from_address(addr)
            else:
                # A clone (also for a backup over two host ranges, which no view can be).
                data = pool.read_host_copy(x, nbytes)
                if data is None:
                    continue
                buf = bytearray(data)
            if is_tensor:
                assert torch is not None
                flat = (torch.frombuffer(buf, dtype=torch.uint8) if len(buf)
                        else torch.empty(0, dtype=torch.uint8))
                return flat.view(x.dtype).view(x.shape)
            import numpy as np

            return np.frombuffer(buf, dtype=np.uint8)
        return None

    def set_disk_backup_dir(self, path: str) -> None:
        """The directory of disk backups (made if missing), for every later pause."""
        settings = self._settings()
        _make_dir(path)
        settings.disk_dir = os.fspath(path)

    # ------------------------------------------------------------------ compatibility

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> str:
        raise AttributeError("hook_mode can only be set")

    @hook_mode.setter
    def hook_mode(self, hook_mode: HookMode) -> None:
        """Either mode: rrmm serves regions through PyTorch's MemPool in both (no preloaded
        library)."""
        if hook_mode not in ("preload", "torch"):
            raise ValueError(f"hook_mode must be 'preload' or 'torch', not {hook_mode!r}")

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("Only setter is supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        """Accepted: rrmm's resume fails cleanly (MemoryError, nothing lost, call again) when
        the device has no room, so no margin is kept."""
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"memory_margin_bytes must be a non-negative int, not {value!r}")


def _make_dir(path: str) -> None:
    """Makes the disk backup directory if missing; ``ValueError`` where it cannot be made or
    written."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"the disk backup directory {path!r} cannot be made: {e}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"the disk backup directory {path!r} is not writable")


def _torch_allocations_through_rrmm() -> None:
    """Makes rrmm's allocator PyTorch's, so that PyTorch's allocations outside explicit
    regions are in the process's region (``TMS_INIT_ENABLE``); nothing without PyTorch or a
    GPU. PyTorch refuses once it has allocated: then a warning says what is not paused."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return
    from rrmm.allocators.torch import rmm_torch_allocator

    try:
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    except RuntimeError as e:
        import warnings

        warnings.warn(
            "torch_memory_saver (rrmm): TMS_INIT_ENABLE=1 puts PyTorch's allocations in a region "
            "through rrmm's allocator, which PyTorch took only before its first CUDA "
            f"allocation ({e}); import torch_memory_saver before allocating, or set rrmm's "
            "allocator yourself: PyTorch's allocations outside region() are not paused now",
            RuntimeWarning, stacklevel=3)


torch_memory_saver = TorchMemorySaver()

if os.environ.get("TMS_INIT_ENABLE") and "torch" in sys.modules:
    # The process is in a region from the start: rrmm's allocator must be PyTorch's before
    # its first CUDA allocation (without a GPU the saver starts at its first use).
    _torch = sys.modules["torch"]
    if _torch.cuda.is_available() and _env_flag("TMS_INIT_ENABLE"):
        torch_memory_saver._ensure_initialized()


def region(
    tag: str = _TAG_DEFAULT,
    enable_cpu_backup: bool = False,
    enable_disk_backup: bool = False,
    cpu_backup_backend: CpuBackupBackend | None = None,
) -> contextlib.AbstractContextManager[None]:
    """``torch_memory_saver.region`` of the singleton."""
    return torch_memory_saver.region(tag=tag, enable_cpu_backup=enable_cpu_backup,
                                     enable_disk_backup=enable_disk_backup,
                                     cpu_backup_backend=cpu_backup_backend)


def pause(tag: str | None = None) -> None:
    """``torch_memory_saver.pause`` of the singleton."""
    torch_memory_saver.pause(tag)


def resume(tag: str | None = None) -> None:
    """``torch_memory_saver.resume`` of the singleton."""
    torch_memory_saver.resume(tag)


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """Child processes started inside use rrmm as torch_memory_saver too (torch_memory_saver
    sets ``LD_PRELOAD`` here; rrmm sets ``RRMM_AS_TORCH_MEMORY_SAVER=1``, restored after)."""
    old = os.environ.get("RRMM_AS_TORCH_MEMORY_SAVER")
    os.environ["RRMM_AS_TORCH_MEMORY_SAVER"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RRMM_AS_TORCH_MEMORY_SAVER", None)
        else:
            os.environ["RRMM_AS_TORCH_MEMORY_SAVER"] = old


__all__ = ["CpuBackupBackend", "HookMode", "TorchMemorySaver", "configure_subprocess", "pause",
           "region", "resume", "torch_memory_saver"]
