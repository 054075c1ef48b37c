"""Numba allocator hook: ``RMMNumbaManager``, an External Memory Management (EMM) plugin.

Use ``numba.cuda.set_memory_manager(RMMNumbaManager)`` or set
``NUMBA_CUDA_MEMORY_MANAGER=rrmm.allocators.numba`` before Numba creates a context. Device
arrays then come from the current rrmm resource of the context's device; a finalizer frees each
allocation when Numba drops it. IPC handles are made with ``cuIpcGetMemHandle`` on the base of
the allocation (rrmm's pools hand out pieces of larger blocks) plus an offset.

Numba (with CUDA support: numba-cuda) is imported with this module. Without it the module
still imports, and looking up ``RMMNumbaManager`` raises an ImportError that says what to
install.
"""

from typing import Any

from rrmm import _rrmm
from rrmm.allocators._missing import missing as _missing

__all__ = ["RMMNumbaManager", "RRMMNumbaManager"]

_hook_allocate = _rrmm.hook_allocate

try:
    from numba import cuda as _cuda  # noqa: F401 (imported to fail early without numba-cuda)
    from numba.cuda import HostOnlyCUDAMemoryManager, IpcHandle, MemoryPointer
    from numba.cuda.cudadrv import driver as _driver
except ImportError as _cause:  # no Numba, or a Numba without CUDA support
    _IMPORT_ERROR = _cause

    def __getattr__(name: str) -> Any:
        if name in ("RMMNumbaManager", "RRMMNumbaManager", "_numba_memory_manager"):
            raise _missing(
                "numba", "rrmm.allocators.numba", "pip install numba-cuda", _IMPORT_ERROR
            ) from _IMPORT_ERROR
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

else:
    import ctypes as _ctypes
    import inspect as _inspect

    _USE_NV_BINDING = bool(getattr(_driver, "USE_NV_BINDING", True))
    _binding: Any = getattr(_driver, "binding", None)
    if _USE_NV_BINDING and _binding is None:
        try:
            from cuda.bindings import driver as _cuda_driver
        except ImportError:
            from cuda import cuda as _cuda_driver
        _binding = _cuda_driver

    if _USE_NV_BINDING:
        _device_ptr = _binding.CUdeviceptr
    else:
        _device_ptr = _ctypes.c_uint64

    # numba-cuda dropped the context argument of MemoryPointer in later releases.
    _MP_PARAMS = list(_inspect.signature(MemoryPointer.__init__).parameters)
    _MP_TAKES_CONTEXT = len(_MP_PARAMS) > 1 and _MP_PARAMS[1] == "context"
    _MemoryInfo = getattr(_driver, "MemoryInfo", None)

    def _address(memory: Any) -> int:
        value = getattr(memory, "device_pointer_value", None)
        if value is not None:
            return int(value)
        handle = memory.handle
        return int(handle) if _USE_NV_BINDING else int(handle.value)

    def _ipc_handle_object(raw: Any) -> Any:
        if _USE_NV_BINDING:
            handle = _binding.CUipcMemHandle()
            handle.reserved = raw
            return handle
        return (_ctypes.c_byte * 64).from_buffer_copy(raw)

    class RMMNumbaManager(HostOnlyCUDAMemoryManager):
        """Numba's EMM plugin over rrmm: device memory from the current rrmm resource of the
        context's device (interface version 1)."""

        _device = None

        def initialize(self) -> None:
            """Called by Numba when the context is first used; caches its device ordinal."""
            self._device = int(self.context.device.id)

        def memalloc(self, size: int) -> Any:
            """Allocates ``size`` bytes on the default stream; returns a ``MemoryPointer`` that
            gives the memory back when Numba drops it."""
            device = self._device
            if device is None:
                device = self._device = int(self.context.device.id)
            owner = _hook_allocate(size, 0, device)
            # The pointer owns the allocation outright: it is freed (by the owner's drop) when
            # the last reference to the pointer, or to a view of it, goes. Cheaper than a
            # weakref finalizer and the same lifetime.
            if _MP_TAKES_CONTEXT:
                mem = MemoryPointer(self.context, _device_ptr(owner.ptr), size)
            else:
                mem = MemoryPointer(_device_ptr(owner.ptr), size)
            mem._rrmm_allocation = owner
            return mem

        def get_ipc_handle(self, memory: Any) -> Any:
            """An ``IpcHandle`` for ``memory``: ``cuIpcGetMemHandle`` of its allocation's base
            and the offset of ``memory`` in it."""
            raw, offset = _rrmm.ipc_mem_handle(_address(memory))
            source_info = self.context.device.get_device_identity()
            return IpcHandle(
                memory, _ipc_handle_object(raw), memory.size, source_info, offset=offset
            )

        def get_memory_info(self) -> Any:
            """Free and total memory of the context's device (``cuMemGetInfo``)."""
            device = self._device
            if device is None:
                device = self._device = int(self.context.device.id)
            free, total = _rrmm.device_memory_info(device)
            return _MemoryInfo(free=free, total=total) if _MemoryInfo else (free, total)

        @property
        def interface_version(self) -> int:
            """The EMM plugin interface version implemented: 1."""
            return 1

    RRMMNumbaManager = RMMNumbaManager

    # Lets NUMBA_CUDA_MEMORY_MANAGER=rrmm.allocators.numba pick the plugin.
    _numba_memory_manager = RMMNumbaManager
