"""CuPy allocator hooks: CuPy allocates device (and pinned host) memory through rrmm.

``cupy.cuda.set_allocator(rmm_cupy_allocator)`` makes every CuPy allocation come from the
current rrmm resource of CuPy's current device, ordered on CuPy's current stream; the memory
lives as long as CuPy's array, and is freed through the same resource on the same stream.

``rmm_cupy_allocator`` (alias ``rrmm_cupy_allocator``) is the ``malloc`` of a CuPy
``CFunctionAllocator`` over two C functions of rrmm's compiled module: CuPy calls rrmm with no
Python frame and no Python object of rrmm's per allocation, which makes it as fast as CuPy's own
pool. Looking it up imports CuPy (an ImportError naming CuPy if it is missing); importing this
module does not. Out of memory raises ``MemoryError`` with rrmm's message; size 0 works.

``rrmm_cupy_unowned_allocator`` is the same hook built the way RMM builds it
(``MemoryPointer(UnownedMemory(ptr, size, owner, device), 0)``, the owner an rrmm object that
frees the memory when CuPy drops it), in one Rust call; it imports CuPy on its first call.
"""

from typing import Any

from rrmm import _rrmm
from rrmm.allocators._missing import missing as _missing

__all__ = [
    "rmm_cupy_allocator",  # noqa: F822 (made on first use by __getattr__)
    "rmm_cupy_pinned_allocator",
    "rrmm_cupy_allocator",  # noqa: F822
    "rrmm_cupy_pinned_allocator",
    "rrmm_cupy_unowned_allocator",
]

_pinned_allocate = _rrmm.pinned_allocate
_PinnedMemoryPointer = None
_c_allocator = None


def _cupy_memory() -> tuple[Any, Any]:
    """Imports CuPy's memory modules, or raises an ImportError naming CuPy."""
    try:
        import cupy  # noqa: F401
        from cupy.cuda import memory, pinned_memory
    except ImportError as cause:
        raise _missing(
            "cupy", "rrmm.allocators.cupy", "pip install cupy-cuda12x (or cupy-cuda13x)", cause
        ) from cause
    return memory, pinned_memory


def rrmm_cupy_c_allocator() -> Any:
    """The CuPy allocator (``CFunctionAllocator(...).malloc`` over rrmm's C functions), made on
    first use; this is what ``rmm_cupy_allocator`` names. Imports CuPy."""
    global _c_allocator
    if _c_allocator is None:
        memory, _ = _cupy_memory()
        malloc, free = _rrmm.cupy_c_allocator_functions()
        _c_allocator = memory.CFunctionAllocator(0, malloc, free, None).malloc
    return _c_allocator


# One Rust call: allocate, then MemoryPointer(UnownedMemory(ptr, size, owner, device), 0).
rrmm_cupy_unowned_allocator = _rrmm.cupy_allocate


def rmm_cupy_pinned_allocator(nbytes: int) -> Any:
    """Allocates ``nbytes`` of pinned host memory from rrmm's ``PinnedHostMemoryResource``;
    returns a ``cupy.cuda.PinnedMemoryPointer``.

    Use with ``cupy.cuda.set_pinned_memory_allocator(rmm_cupy_pinned_allocator)``.
    """
    global _PinnedMemoryPointer
    if _PinnedMemoryPointer is None:
        _PinnedMemoryPointer = _cupy_memory()[1].PinnedMemoryPointer
    return _PinnedMemoryPointer(_pinned_allocate(nbytes), 0)


rrmm_cupy_pinned_allocator = rmm_cupy_pinned_allocator


def _cupy_missing_allocator(cause: BaseException) -> Any:
    """The allocator named when CuPy cannot be imported: importing it works (as with RMM), calling
    it raises ModuleNotFoundError."""

    # RMM's message first; then why (when CuPy is there but fails to import) and the fix, once.
    root = cause.__cause__ or cause
    why = "" if str(root) == "No module named 'cupy'" else f"importing it failed: {root}; "
    message = (f"No module named 'cupy' (rrmm.allocators.cupy needs CuPy: {why}install it "
               "with `pip install cupy-cuda12x` or `pip install cupy-cuda13x`)")

    def rmm_cupy_allocator(nbytes: int) -> Any:
        error = ModuleNotFoundError(message)
        error.name = "cupy"
        raise error

    return rmm_cupy_allocator


def __getattr__(name: str) -> Any:
    if name in ("rmm_cupy_allocator", "rrmm_cupy_allocator"):
        try:
            allocator = rrmm_cupy_c_allocator()
        except ImportError as cause:
            return _cupy_missing_allocator(cause)
        globals()["rmm_cupy_allocator"] = globals()["rrmm_cupy_allocator"] = allocator
        return allocator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
