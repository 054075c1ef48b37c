"""rrmm: a fast CUDA device-memory manager in Rust with RMM's Python API.

Code written for RMM runs with ``import rrmm as rmm`` (``rrmm.mr``, ``rrmm.DeviceBuffer``,
``rrmm.reinitialize``, the CuPy, Numba and PyTorch hooks in ``rrmm.allocators``).
rrmm is not on PyPI: install it from a clone (``pip install .``).

What rrmm does beyond RMM, each shown in the README ("What rrmm adds", one snippet for a GPU and
one that runs anywhere) and in docs/api.md:

- sleep and wake, every address kept: ``rrmm.sleep()``, ``offload()``/``restore()`` of an
  ``rrmm.mr.ExpandableMemoryResource``;
- spill to host and promotion: ``ExpandableMemoryResource(spill_to_host=...)``, ``promote()``;
  data of any size with no size to give: ``rrmm.reinitialize(pool_allocator="any_size")``,
  spilled data moved back at safe points (``rrmm.at_rest()``);
- one GPU, many processes: ``rrmm.shared_gpu`` (a ledger; ``RRMM_SHARE_GPU=1``), and without a
  GPU ``rrmm.mr.SimulatedMemoryResource(size, shared="name")``, one device several processes
  share;
- one copy, many processes: ``ExpandableMemoryResource(shareable=True)``, ``pool.publish()``,
  ``rrmm.share.attach()`` (other processes map the pool's pages, no copy);
- the engines' sleep APIs: ``rrmm.compat.torch_memory_saver``, ``rrmm.compat.vllm_cumem``
  (``RRMM_AS_TORCH_MEMORY_SAVER=1``, ``RRMM_AS_VLLM_CUMEM=1``; ``RRMM_AS_RMM=1`` for
  ``import rmm``);
- Dask: ``rrmm.dask`` (a worker plugin, ``RRMMSetup``);
- ``rrmm replay`` and ``rrmm snapshot view`` (``python -m rrmm --help``).

``rrmm.compat`` and ``rrmm.dask`` are imported on first access (importing rrmm imports no
framework: not CuPy, PyTorch, Numba or Dask).
"""

from __future__ import annotations

from typing import Any

from rrmm import (
    _cuda,  # noqa: F401 (RMM's tests reach rmm._cuda.gpu after `import rmm`)
    host_pages,  # noqa: F401 (rrmm's supply of host pages: rrmm.host_pages)
    mr,
    share,  # noqa: F401 (one copy, many processes: rrmm.share)
    shared_gpu,  # noqa: F401 (one GPU, many processes: rrmm.shared_gpu)
    statistics,
)
from rrmm._host_buffer import HostBuffer
from rrmm._logging import (
    flush_logger,
    get_flush_level,
    get_logging_level,
    level_enum,
    set_flush_level,
    set_logging_level,
    should_log,
)
from rrmm._rrmm import parse_bytes
from rrmm._sleep import at_rest, sleep
from rrmm._snapshot import memory_snapshot, memory_summary, record_memory_history
from rrmm._version import __git_commit__, __version__
from rrmm.mr import disable_logging, enable_logging, get_log_filenames
from rrmm.pylibrmm.device_buffer import DeviceBuffer
from rrmm.pylibrmm.stream import DEFAULT_STREAM as _DEFAULT_STREAM
from rrmm.rmm import (
    RMMError,
    is_initialized,
    register_reinitialize_hook,
    reinitialize,
    unregister_reinitialize_hook,
)

__all__ = [
    "DeviceBuffer",
    "HostBuffer",
    "RMMError",
    "RMMNumbaManager",
    "__git_commit__",
    "__version__",
    "at_rest",
    "disable_logging",
    "enable_logging",
    "flush_logger",
    "get_flush_level",
    "get_log_filenames",
    "get_logging_level",
    "is_initialized",
    "level_enum",
    "memory_snapshot",
    "memory_summary",
    "mr",
    "parse_bytes",
    "record_memory_history",
    "register_reinitialize_hook",
    "reinitialize",
    "rmm_cupy_allocator",
    "set_flush_level",
    "set_logging_level",
    "should_log",
    "sleep",
    "statistics",
    "to_device",
    "unregister_reinitialize_hook",
]


def to_device(obj: Any, stream: Any = _DEFAULT_STREAM, mr: Any = None) -> DeviceBuffer:
    """A new ``DeviceBuffer`` holding a copy of the bytes of ``obj``: ``bytes`` or any
    C-contiguous buffer of any dtype and shape (older RMM releases' ``rmm.to_device``).

    Raises TypeError when ``obj`` has no buffer and ValueError when it is not C-contiguous.
    """
    view = memoryview(obj)
    if not view.c_contiguous:
        raise ValueError("to_device needs a C-contiguous buffer")
    if view.ndim != 1 or view.format not in ("B", "b", "c", "?"):
        view = view.cast("B")
    return DeviceBuffer.to_device(view, stream=stream, mr=mr)


# Names of older RMM releases, found on first use so that no framework is imported with rrmm:
# ``rmm.rmm_cupy_allocator``, ``rmm.RMMNumbaManager`` and Numba's plugin entry
# (``NUMBA_CUDA_MEMORY_MANAGER=rrmm`` looks up ``rrmm._numba_memory_manager``).
_LAZY = {
    "rmm_cupy_allocator": ("rrmm.allocators.cupy", "rmm_cupy_allocator"),
    "RMMNumbaManager": ("rrmm.allocators.numba", "RMMNumbaManager"),
    "_numba_memory_manager": ("rrmm.allocators.numba", "_numba_memory_manager"),
}


#: Subpackages imported on first access, as attributes (``rrmm.dask`` imports Dask's
#: ``distributed``; ``rrmm.compat`` the engines' modules, which import PyTorch only when used).
_LAZY_MODULES = ("compat", "dask")


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The package's names for ``dir(rrmm)`` and completion: its own and those imported on first
    access, not the names its source imports for itself (``Any``, ``annotations``)."""
    hidden = {"Any", "annotations"}
    names = {n for n in globals() if n not in hidden}
    names.update(n for n in _LAZY if not n.startswith("_"))
    names.update(_LAZY_MODULES)
    return sorted(names)
