"""The process-wide host resource has one owner, the Rust core: Python's
``get_current_host_resource`` and the CuPy pinned allocator hook see the same resource, with
the same default (pinned host memory; the system allocator without a CUDA driver)."""

from __future__ import annotations

from conftest import gpu_available
from rrmm import _rrmm, mr


def test_the_hook_and_python_share_one_default():
    before = mr.get_current_host_resource()
    try:
        mr.set_current_host_resource(None)
        # The hook asks first: the core makes the default (before, with no driver, the core's
        # default was pinned memory and this raised, while Python's was system memory).
        hooked = _rrmm.pinned_allocate(4096)
        default = mr.get_current_host_resource()
        expected = mr.PinnedHostMemoryResource if gpu_available() else mr.SystemMemoryResource
        assert type(default) is expected
        assert default._rrmm_kind == ("pinned_host" if gpu_available() else "host")
        assert mr.get_current_host_resource() is default
        del hooked
        # The object Python asked for is the one the hook allocates from from now on.
        ptr = default.allocate(4096)
        default.deallocate(ptr, 4096)
    finally:
        mr.set_current_host_resource(before)
    assert mr.get_current_host_resource() is before


def test_a_set_resource_is_what_python_and_the_hook_get():
    before = mr.get_current_host_resource()
    system = mr.SystemMemoryResource()
    try:
        mr.set_current_host_resource(system)
        assert mr.get_current_host_resource() is system
        assert _rrmm._current_host_resource() is system
        mr.set_current_host_resource(None)
        fresh = mr.get_current_host_resource()
        assert fresh is not system and mr.get_current_host_resource() is fresh
    finally:
        mr.set_current_host_resource(before)
