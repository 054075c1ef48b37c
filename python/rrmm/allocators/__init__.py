"""Allocator hooks that make CuPy, Numba and PyTorch allocate through rrmm.

Each submodule imports its framework only when its hook is used, so none of CuPy, Numba or
PyTorch is needed to install or import rrmm:

- ``rrmm.allocators.cupy``: ``rmm_cupy_allocator`` (alias ``rrmm_cupy_allocator``) for
  ``cupy.cuda.set_allocator``, and ``rmm_cupy_pinned_allocator`` for
  ``cupy.cuda.set_pinned_memory_allocator``.
- ``rrmm.allocators.numba``: ``RMMNumbaManager``, Numba's external memory manager plugin
  (also ``NUMBA_CUDA_MEMORY_MANAGER=rrmm.allocators.numba``).
- ``rrmm.allocators.torch``: ``rmm_torch_allocator``, a ``CUDAPluggableAllocator`` over C entry
  points exported by rrmm's own compiled module.

Every hook allocates from the current rrmm resource of the device it is asked for
(``rrmm.mr.set_current_device_resource`` / ``set_per_device_resource``).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FRAMEWORKS", "cupy", "numba", "torch", "use_rrmm_for"]


def _use_for_cupy() -> None:
    try:
        import cupy
    except ImportError as e:
        raise ImportError("CuPy is not installed.") from e
    from rrmm.allocators.cupy import rmm_cupy_allocator

    cupy.cuda.set_allocator(rmm_cupy_allocator)


def _use_for_torch() -> None:
    try:
        import torch
    except ImportError as e:
        raise ImportError("PyTorch is not installed.") from e
    from rrmm.allocators.torch import rmm_torch_allocator

    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)


#: The frameworks whose allocator rrmm can take over, by name, and how (dask-cuda's
#: ``rmm_allocator_external_lib_list`` names; Numba's plugin is chosen by the environment,
#: ``NUMBA_CUDA_MEMORY_MANAGER=rrmm.allocators.numba``, before Numba starts).
FRAMEWORKS: dict[str, Callable[[], None]] = {"cupy": _use_for_cupy, "torch": _use_for_torch}


def use_rrmm_for(framework: str) -> None:
    """Makes ``framework`` (a key of ``FRAMEWORKS``) allocate through rrmm's current resource.

    Raises ValueError for an unknown name and ImportError when the framework is not installed.
    """
    try:
        use = FRAMEWORKS[framework]
    except KeyError:
        raise ValueError(
            f"The library '{framework}' is not supported for RMM integration. "
            f"Supported libraries are: {', '.join(FRAMEWORKS)}."
        ) from None
    use()

