"""CuPy allocator hooks: CuPy allocates device (and pinned host) memory through rrmm.

``cupy.cuda.set_allocator(rmm_cupy_allocator)`` makes every CuPy allocation come from the
current rrmm resource of CuPy's current device, ordered on CuPy's current stream; the memory
lives as long as CuPy's array. CuPy is imported on the first call, not before.
"""

from rrmm import _rrmm
from rrmm.allocators import _missing

__all__ = [
    "rmm_cupy_allocator",
    "rrmm_cupy_allocator",
    "rmm_cupy_pinned_allocator",
    "rrmm_cupy_pinned_allocator",
]

_hook_allocate = _rrmm.hook_allocate
_pinned_allocate = _rrmm.pinned_allocate

# CuPy's objects, bound on first use (module globals are the cheapest lookups in the hot path).
_UnownedMemory = None
_MemoryPointer = None
_PinnedMemoryPointer = None
_stream_ptr = None
_device_id = None


def _bind():
    """Imports CuPy and caches what the hot path calls."""
    global _UnownedMemory, _MemoryPointer, _PinnedMemoryPointer, _stream_ptr, _device_id
    try:
        import cupy  # noqa: F401
        from cupy.cuda import device as _device
        from cupy.cuda import memory as _memory
        from cupy.cuda import pinned_memory as _pinned
        from cupy.cuda import runtime as _runtime
        from cupy.cuda import stream as _stream
    except ImportError as cause:
        raise _missing(
            "cupy", "rrmm.allocators.cupy", "pip install cupy-cuda12x (or cupy-cuda13x)", cause
        ) from cause
    stream_ptr = getattr(_stream, "get_current_stream_ptr", None)
    if stream_ptr is None:  # older CuPy: one more attribute access per call
        get_current_stream = _stream.get_current_stream

        def stream_ptr():
            return get_current_stream().ptr

    _stream_ptr = stream_ptr
    _device_id = getattr(_device, "get_device_id", None) or _runtime.getDevice
    _PinnedMemoryPointer = _pinned.PinnedMemoryPointer
    _MemoryPointer = _memory.MemoryPointer
    _UnownedMemory = _memory.UnownedMemory


def _rmm_cupy_allocator_py(nbytes):
    """The same hook as ``rmm_cupy_allocator``, in Python (kept for comparison and debugging)."""
    if _UnownedMemory is None:
        _bind()
    device = _device_id()
    owner = _hook_allocate(nbytes, _stream_ptr(), device)
    return _MemoryPointer(_UnownedMemory(owner.ptr, nbytes, owner, device), 0)


# The hook itself is one Rust function (no Python frame in the hot path): it allocates from the
# current rrmm resource of CuPy's current device on CuPy's current stream and returns
# ``cupy.cuda.MemoryPointer(UnownedMemory(ptr, nbytes, owner, device), 0)``; size 0 works;
# ``MemoryError`` when the resource is out of memory; CuPy is imported on the first call.
rmm_cupy_allocator = _rrmm.cupy_allocate
rrmm_cupy_allocator = rmm_cupy_allocator

_c_allocator = None


def rrmm_cupy_c_allocator():
    """The same hook through CuPy's ``CFunctionAllocator``: CuPy calls rrmm's C functions
    directly, and no Python object of rrmm's is made per allocation. Returns the allocator's
    bound ``malloc``, for ``cupy.cuda.set_allocator``. Imports CuPy."""
    global _c_allocator
    if _c_allocator is None:
        if _UnownedMemory is None:
            _bind()
        from cupy.cuda.memory import CFunctionAllocator

        malloc, free = _rrmm.cupy_c_allocator_functions()
        _c_allocator = CFunctionAllocator(0, malloc, free, None).malloc
    return _c_allocator


def rmm_cupy_pinned_allocator(nbytes):
    """Allocates ``nbytes`` of pinned host memory from rrmm's ``PinnedHostMemoryResource``;
    returns a ``cupy.cuda.PinnedMemoryPointer``.

    Use with ``cupy.cuda.set_pinned_memory_allocator(rmm_cupy_pinned_allocator)``.
    """
    if _PinnedMemoryPointer is None:
        _bind()
    return _PinnedMemoryPointer(_pinned_allocate(nbytes), 0)


rrmm_cupy_pinned_allocator = rmm_cupy_pinned_allocator
