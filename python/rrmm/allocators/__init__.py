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

__all__ = ["cupy", "numba", "torch"]


def _missing(package: str, hook: str, install: str, cause: BaseException) -> ImportError:
    """The ImportError a hook raises when its framework is not installed."""
    error = ImportError(
        f"{hook} needs {package}, which could not be imported ({cause}); install it with "
        f"`{install}`"
    )
    error.name = package
    return error
