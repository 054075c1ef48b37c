"""vLLM's sleep-mode backend ``rrmm`` (``vllm serve --enable-sleep-mode --sleep-mode-backend
rrmm``, with ``RRMM_AS_VLLM_CUMEM=1``): vLLM's ``SleepModeBackend`` over rrmm's tagged pools.

vLLM's workers allocate weights, KV cache and their other state through
``vllm.device_allocator.cumem``'s ``CuMemAllocator``; ``RRMM_AS_VLLM_CUMEM=1`` makes that
rrmm's (``rrmm.compat.vllm_cumem``: a pool per tag), and this backend moves those pools:

- ``suspend(1)``: the tags ``weights``, ``runtime`` and ``cudagraph`` are copied to host memory,
  every other tag (``kv_cache``, ``workspace``, ...) is discarded; ``suspend(2)``: ``weights``
  is discarded too (vLLM reloads it). Each tag's device memory is given back and every address
  kept, so tensors and CUDA graphs stay valid. The levels are vLLM 0.33's (its ``cumem``
  backend offloads the same tags).
- ``resume(tags=None)``: every sleeping tag wakes, or those in ``tags`` and every one but
  ``weights`` and ``kv_cache`` (vLLM's deferrable tags); ``discard(tags)``: those tags' memory is
  given back without a copy.
- ``state()``: ``"RESUMING"`` while ``resume`` runs, else ``"SUSPENDED"`` while a tag is asleep
  (a partial wake leaves the engine suspended), else ``"RUNNING"``. It reads the pools' own
  state (``CuMemAllocator.asleep_tags()``): nothing here keeps a copy of it.
- Capabilities: ``is_supported()`` only where vLLM's workers allocate from rrmm
  (``vllm.device_allocator.cumem`` is ``rrmm.compat.vllm_cumem``) and a CUDA driver is loaded;
  communicators are preserved (their memory is outside the tags' pools, and nothing tears them
  down) and so are compiled artifacts (the process and its CUDA context stay); CUDA graphs
  holding communicators are not claimed (their registered buffers may be in a pool that
  sleeps), nor durable storage (the host copy lives in this process).

``rrmm``'s wheel registers the backend with vLLM's factory from the ``vllm.general_plugins``
entry point ``rrmm`` (``rrmm.compat.vllm_plugin.register``); vLLM imports this module only when
the backend is chosen. Where vLLM is not installed the class stands alone (over ``object``), as
in rrmm's tests.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Literal

from rrmm.compat import vllm_cumem
from rrmm.compat.vllm_cumem import CuMemAllocator

_log = logging.getLogger(__name__)

SleepModeState = Literal["RUNNING", "SUSPENDED", "RESUMING"]

#: Copied to host memory at every level: state vLLM does not rebuild on a wake.
OFFLOADED_AT_EVERY_LEVEL: tuple[str, ...] = ("runtime", vllm_cumem.CUDAGRAPH_TAG)
#: What each level copies to host memory; every other tag is discarded.
OFFLOADED_TAGS: dict[int, tuple[str, ...]] = {
    1: ("weights", *OFFLOADED_AT_EVERY_LEVEL),
    2: OFFLOADED_AT_EVERY_LEVEL,
}


def _vllm_backend_base() -> type:
    """vLLM's ``SleepModeBackend`` where vLLM has the seam, else ``object``."""
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackend
    except ImportError:
        return object
    return SleepModeBackend


if TYPE_CHECKING:
    _Base = object
else:
    _Base = _vllm_backend_base()


class RrmmSleepModeBackend(_Base):
    """vLLM's sleep-mode backend over ``CuMemAllocator``'s tagged pools."""

    def __init__(self, allocator: CuMemAllocator | None = None) -> None:
        super().__init__()
        self._allocator = CuMemAllocator.get_instance() if allocator is None else allocator
        self._resuming = False

    def suspend(self, level: int = 1) -> None:
        """Gives the device memory of every tag back: level 1 copies ``weights`` to host memory
        and discards the KV cache, level 2 discards both (``OFFLOADED_TAGS``).

        Raises TypeError or ValueError for another level, MemoryError when the host has no
        room for the copy (that tag stays awake, every byte in place)."""
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"level must be an int, not {type(level).__name__}")
        if level not in OFFLOADED_TAGS:
            raise ValueError(f"level must be 1 (weights to host memory, KV cache discarded) or "
                             f"2 (both discarded), not {level}")
        self._allocator.sleep(offload_tags=OFFLOADED_TAGS[level])

    def resume(self, tags: list[str] | None = None) -> None:
        """Wakes every sleeping tag, or those in ``tags`` and every one vLLM never defers.

        Raises MemoryError when the device has no room (nothing lost: call again)."""
        self._resuming = True
        try:
            self._allocator.wake_up(tags)
        finally:
            self._resuming = False

    def state(self) -> SleepModeState:
        """``"RESUMING"`` during ``resume``, ``"SUSPENDED"`` while any tag sleeps, else
        ``"RUNNING"``."""
        if self._resuming:
            return "RESUMING"
        return "SUSPENDED" if self._allocator.asleep_tags() else "RUNNING"

    def discard(self, tags: tuple[str, ...]) -> None:
        """Gives ``tags``' device memory back without a copy."""
        self._allocator.discard(tags)

    @classmethod
    def unsupported_reason(cls) -> str | None:
        """Why the backend cannot run in this process (None when it can)."""
        try:
            cumem = importlib.import_module("vllm.device_allocator.cumem")
        except ImportError as e:
            return f"vllm.device_allocator.cumem does not import ({e})"
        if cumem is not vllm_cumem:
            return ("vLLM's workers allocate from vLLM's own CuMemAllocator: set "
                    "RRMM_AS_VLLM_CUMEM=1 before Python starts, so that "
                    "vllm.device_allocator.cumem is rrmm.compat.vllm_cumem")
        from rrmm import _rrmm

        if not _rrmm.driver_available():
            return f"no CUDA driver: {_rrmm.driver_error()}"
        return None

    @classmethod
    def is_supported(cls) -> bool:
        """Whether vLLM's workers allocate from rrmm's pools and a CUDA driver is loaded (the
        reason is logged as a warning when not)."""
        why = cls.unsupported_reason()
        if why is not None:
            _log.warning("sleep-mode backend 'rrmm' is not supported: %s", why)
        return why is None

    @classmethod
    def preserves_communicators(cls) -> bool:
        """True: a suspend moves only the tags' pools; communicators' memory is outside them."""
        return True

    @classmethod
    def preserves_compiled_artifacts(cls) -> bool:
        """True: the process and its CUDA context (loaded kernels) stay."""
        return True

    @classmethod
    def preserves_graphs_with_communicators(cls) -> bool:
        """False: a graph's registered communication buffers may be in a pool that sleeps."""
        return False

    @classmethod
    def supports_durable_storage(cls) -> bool:
        """False: the host copy lives in this process."""
        return False


__all__ = ["OFFLOADED_AT_EVERY_LEVEL", "OFFLOADED_TAGS", "RrmmSleepModeBackend",
           "SleepModeState"]
