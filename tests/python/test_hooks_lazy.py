"""CPU tests of the hooks: importing them needs no framework, a missing framework is named, and
rrmm's compiled module exports the PyTorch entry points. Runs everywhere (no GPU needed)."""

import ctypes
import importlib
import sys

import pytest
from rrmm import _rrmm


def _fresh(name, monkeypatch, missing):
    """Imports `name` anew with the framework modules in `missing` made unimportable."""
    for mod in missing:
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


def test_allocators_import_without_frameworks(monkeypatch):
    pkg = _fresh("rrmm.allocators", monkeypatch, [])
    assert set(pkg.__all__) == {"FRAMEWORKS", "cupy", "numba", "torch", "use_rrmm_for"}
    assert set(pkg.FRAMEWORKS) == {"cupy", "torch"}


def test_cupy_hook_names_the_missing_package(monkeypatch):
    import importlib.util

    cupy_installed = importlib.util.find_spec("cupy") is not None
    mod = _fresh("rrmm.allocators.cupy", monkeypatch, ["cupy", "cupy.cuda"])
    for name in ("rmm_cupy_allocator", "rrmm_cupy_allocator"):
        # As RMM: importing the allocator works without CuPy; calling it raises.
        allocator = getattr(mod, name)
        with pytest.raises(ModuleNotFoundError, match="cupy") as info:
            allocator(16)
        assert info.value.name == "cupy"
    if not cupy_installed:  # the Rust hook keeps CuPy's functions once it has found them
        with pytest.raises(ImportError, match="cupy") as info:
            mod.rrmm_cupy_unowned_allocator(16)
        assert info.value.name == "cupy"
    with pytest.raises(ImportError, match="cupy"):
        mod.rmm_cupy_pinned_allocator(16)
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018


def test_numba_hook_names_the_missing_package(monkeypatch):
    mod = _fresh("rrmm.allocators.numba", monkeypatch, ["numba", "numba.cuda"])
    for name in ("RMMNumbaManager", "_numba_memory_manager"):
        with pytest.raises(ImportError, match="numba-cuda"):
            getattr(mod, name)
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018


def test_torch_hook_names_the_missing_package(monkeypatch):
    mod = _fresh("rrmm.allocators.torch", monkeypatch, ["torch", "torch.cuda", "torch.cuda.memory"])
    with pytest.raises(ImportError, match="torch"):
        mod.rmm_torch_allocator  # noqa: B018
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018


def test_torch_entry_points_are_exported_from_the_extension_module():
    from rrmm.allocators import torch as hook

    assert hook.symbols() == ("rrmm_torch_allocate", "rrmm_torch_deallocate")
    lib = ctypes.CDLL(hook.library_path())
    addresses = tuple(
        ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in hook.symbols()
    )
    assert addresses == _rrmm.torch_allocator_addresses()


def test_size_zero_needs_no_resource_and_frees_nothing():
    a = _rrmm.hook_allocate(0, 0x1234, 0)
    assert (a.ptr, a.size, a.stream, a.device, a.freed) == (0, 0, 0x1234, 0, False)
    assert int(a) == 0
    a.free()
    assert a.freed
    a.free()
    assert "HookAllocation" in repr(a)
    assert _rrmm.pinned_allocate(0).ptr == 0


def test_errors_are_python_exceptions_not_crashes():
    try:
        a = _rrmm.hook_allocate(1024, 0, 0)
    except (RuntimeError, MemoryError) as exc:  # no driver here: an error, not a crash
        assert str(exc)
    else:  # a GPU machine: a real allocation
        assert a.ptr % 256 == 0 and a.ptr != 0
        a.free()
    with pytest.raises(ValueError):
        _rrmm.ipc_mem_handle(0)


def _simulated_statistics():
    """rrmm.mr (a missing class is a failure, not a skip)."""
    import rrmm.mr

    return rrmm.mr


def _current_bytes(stats):
    counts = stats.allocation_counts
    return counts["current_bytes"] if isinstance(counts, dict) else counts.current_bytes


def test_hook_and_torch_entry_points_allocate_from_the_per_device_resource():
    mr = _simulated_statistics()
    stats = mr.StatisticsResourceAdaptor(mr.SimulatedMemoryResource(1 << 30))
    # An ordinal no other test uses: simulated memory may stand for a device that is not there
    # (ordinals below 1024, MAX_VIRTUAL_DEVICES in Rust); no context, so no real device either.
    device = 700
    mr.set_per_device_resource(device, stats)
    a = _rrmm.hook_allocate(1 << 20, 0x55, device)
    assert a.ptr != 0 and a.stream == 0x55
    assert _current_bytes(stats) == 1 << 20
    del a
    assert _current_bytes(stats) == 0

    # The C entry points PyTorch calls, called through ctypes (success paths only: a
    # failure throws a C++ exception, which ctypes cannot catch).
    from rrmm.allocators import torch as hook

    lib = ctypes.CDLL(hook.library_path())
    alloc = lib.rrmm_torch_allocate
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    free = lib.rrmm_torch_deallocate
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    ptr = alloc(3000, device, None)
    assert ptr and ptr % 256 == 0
    assert _current_bytes(stats) == 3000
    free(ptr, 3000, device, None)
    assert _current_bytes(stats) == 0
    assert alloc(0, device, None) is None


def _capsule(function, signature):
    """A capsule holding a C function pointer under a Cython-style signature name."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.cast(function, ctypes.c_void_p), signature, None)


def test_stream_capsules_are_called_only_with_the_expected_signature():
    getter = ctypes.CFUNCTYPE(ctypes.c_ssize_t)(lambda: 0x5A5A00)
    names = [b"intptr_t (void)", b"intptr_t (void) except? -1", b"int (int)", b"void *(void)"]
    capsules = [_capsule(getter, name) for name in names]
    results = [_rrmm.call_stream_capsule(capsule) for capsule in capsules]
    assert results == [0x5A5A00, 0x5A5A00, None, None]
    assert _rrmm.call_stream_capsule(object()) is None  # not a capsule at all

