"""PyTorch allocator hook: ``torch.cuda.memory.change_current_allocator(rmm_torch_allocator)``.

``rmm_torch_allocator`` is a ``torch.cuda.memory.CUDAPluggableAllocator`` over two C entry
points exported by rrmm's own compiled module (``rrmm_torch_allocate`` /
``rrmm_torch_deallocate``): each allocation comes from the current rrmm resource of the device
PyTorch asks for, on PyTorch's stream, and so shows in rrmm's statistics when a
``StatisticsResourceAdaptor`` is that resource (PyTorch's own ``memory_allocated()`` cannot see a
pluggable allocator). Out of memory raises ``torch.cuda.OutOfMemoryError`` (a ``RuntimeError``),
as PyTorch's own allocator does, with rrmm's explanation as its message, for the PyTorch versions
rrmm was tested with (``tested_torch_versions()``); with any other version it raises a plain
``RuntimeError`` with the same message (``out_of_memory_mode()`` says which). It also works as
``torch.cuda.MemPool(rmm_torch_allocator.allocator())``.

PyTorch is imported when ``rmm_torch_allocator`` is first looked up, not before; PyTorch lets a
process change its allocator only before the first CUDA allocation.
"""

from typing import Any

from rrmm import _rrmm
from rrmm.allocators._missing import missing as _missing

# The allocator objects are made on first use by __getattr__.
__all__ = [  # noqa: F822
    "library_path",
    "out_of_memory_mode",
    "rmm_torch_allocator",
    "rrmm_torch_allocator",
    "symbols",
    "tested_torch_versions",
]

_allocator = None
_mode: str | None = None


def library_path() -> str:
    """The path of rrmm's compiled module, which exports the allocator's C entry points."""
    return _rrmm.__file__


def symbols() -> tuple[str, str]:
    """The names of the exported allocate and free functions."""
    return _rrmm.torch_allocator_symbols()


def tested_torch_versions() -> tuple[str, ...]:
    """The PyTorch releases (``major.minor``) whose ``c10::OutOfMemoryError`` rrmm raises."""
    return tuple(_rrmm.torch_tested_versions())


def out_of_memory_mode() -> str | None:
    """How out of memory reaches PyTorch, once the allocator is made: ``"OutOfMemoryError"``
    (``torch.cuda.OutOfMemoryError``), ``"bad_alloc"`` (``RuntimeError``, a PyTorch version rrmm
    was not tested with) or ``"null"`` (no PyTorch C++ library loaded); None before."""
    return _mode


def _make_allocator() -> Any:
    global _allocator, _mode
    if _allocator is None:
        try:
            import torch
            from torch.cuda.memory import CUDAPluggableAllocator
        except ImportError as cause:
            raise _missing("torch", "rrmm.allocators.torch", "pip install torch", cause) from cause
        # PyTorch's libraries are loaded now: the shim finds its C++ runtime and, for a tested
        # version, its c10::OutOfMemoryError.
        _mode = _rrmm.torch_shim_configure(str(torch.__version__))
        alloc_name, free_name = symbols()
        _allocator = CUDAPluggableAllocator(library_path(), alloc_name, free_name)
    return _allocator


def __getattr__(name: str) -> Any:
    if name in ("rmm_torch_allocator", "rrmm_torch_allocator"):
        return _make_allocator()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
