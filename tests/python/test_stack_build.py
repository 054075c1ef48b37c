"""``_rrmm.build_stack``: every stack kind built and wrapped in one call, each resource of the
stack the full object of its ``rrmm.mr`` class (methods working) all the way down
``upstream_mr``; options misspelt are a TypeError at the call. On simulated memory without a
GPU; ``reinitialize`` over every kind on the GPU."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import rrmm
from conftest import gpu_available, gpu_skip_reason
from hypothesis import given
from hypothesis import strategies as st
from rrmm import _rrmm, _stack, mr

MiB = 1 << 20

# Each kind's classes, top to bottom, on a simulated device and on the GPU.
ON_SIMULATED = {
    "pool": ["PoolMemoryResource", "SimulatedMemoryResource"],
    "expandable": ["ExpandableMemoryResource"],
    "any_size": ["ExpandableMemoryResource"],
    "binning": ["BinningMemoryResource", "PoolMemoryResource", "SimulatedMemoryResource"],
    "arena": ["ArenaMemoryResource", "SimulatedMemoryResource"],
    "fixed_size": ["FixedSizeMemoryResource", "SimulatedMemoryResource"],
    "cuda_async": ["SimulatedMemoryResource"],
    "cuda": ["SimulatedMemoryResource"],
    "managed": ["SimulatedMemoryResource"],
    "managed_pool": ["PoolMemoryResource", "SimulatedMemoryResource"],
    "fallback": ["FallbackResourceAdaptor", "PoolMemoryResource", "SimulatedMemoryResource"],
    "pinned": ["SimulatedMemoryResource"],
    "pinned_pool": ["PoolMemoryResource", "SimulatedMemoryResource"],
    "pinned_expandable": ["ExpandableMemoryResource"],
    "simulated": ["SimulatedMemoryResource"],
    "tiered": ["TieredMemoryResource", "PoolMemoryResource", "SimulatedMemoryResource"],
}
ON_DEVICE = {
    "pool": ["PoolMemoryResource", "CudaMemoryResource"],
    "expandable": ["ExpandableMemoryResource"],
    "any_size": ["ExpandableMemoryResource"],
    "binning": ["BinningMemoryResource", "PoolMemoryResource", "CudaMemoryResource"],
    "arena": ["ArenaMemoryResource", "CudaMemoryResource"],
    "fixed_size": ["FixedSizeMemoryResource", "CudaMemoryResource"],
    "cuda_async": ["CudaAsyncMemoryResource"],
    "cuda": ["CudaMemoryResource"],
    "managed": ["ManagedMemoryResource"],
    "managed_pool": ["PoolMemoryResource", "ManagedMemoryResource"],
    "fallback": ["FallbackResourceAdaptor", "PoolMemoryResource", "CudaMemoryResource"],
    "pinned": ["PinnedHostMemoryResource"],
    "pinned_pool": ["PoolMemoryResource", "PinnedHostMemoryResource"],
    "pinned_expandable": ["ExpandableMemoryResource"],
    "tiered": ["TieredMemoryResource", "PoolMemoryResource", "CudaMemoryResource"],
}
# What each class answers beyond allocate/deallocate: calls that raise on a partial object.
PROBES: dict[str, Any] = {
    "PoolMemoryResource": lambda r: (r.pool_size(), r.free_bytes(), r.maximum_pool_size()),
    "SimulatedMemoryResource": lambda r: (r.size, r.bytes_in_use(), r.host_memory),
    "ExpandableMemoryResource": lambda r: r.mapped_bytes(),
    "BinningMemoryResource": lambda r: r.bin_mrs,
    "ArenaMemoryResource": lambda r: (r.arena_size(), r.free_bytes()),
    "FixedSizeMemoryResource": lambda r: (r.block_size(), r.pool_size()),
    "FallbackResourceAdaptor": lambda r: (r.counts(), PROBES[type(r.alternate_mr).__name__](
        r.alternate_mr)),
    "CudaMemoryResource": lambda r: None,
    "TieredMemoryResource": lambda r: (r.tier_counts(), r.tier_names, [
        PROBES[type(t).__name__](t) for t in r.tiers[1:]]),
    "PeerMemoryResource": lambda r: (r.peer, r.device),
    "CudaAsyncMemoryResource": lambda r: r.pool_handle(),
    "ManagedMemoryResource": lambda r: (r.cached_bytes(), r.held_bytes(), r.cache_limit),
    "PinnedHostMemoryResource": lambda r: (r.numa_node, r.registered_from),
    "LimitingResourceAdaptor": lambda r: (r.get_allocated_bytes(), r.get_allocation_limit()),
    "LoggingResourceAdaptor": lambda r: (r.flush(), r.get_file_name()),
    "StatisticsResourceAdaptor": lambda r: r.allocation_counts,
    "TrackingResourceAdaptor": lambda r: r.get_allocated_bytes(),
}


def chain(top: Any) -> list[Any]:
    """The resources of a stack, top to bottom, through ``upstream_mr``."""
    out = []
    while top is not None:
        out.append(top)
        top = getattr(top, "upstream_mr", None)
    return out


def check_full_objects(top: Any, expected: list[str]) -> None:
    """Each resource is of its ``rrmm.mr`` class and answers its own methods; the stack
    allocates and frees."""
    resources = chain(top)
    assert [type(r).__name__ for r in resources] == expected
    for r in resources:
        assert type(r) is getattr(mr, type(r).__name__), type(r)
        PROBES[type(r).__name__](r)
    ptr = top.allocate(MiB)
    top.deallocate(ptr, MiB)


def test_every_kind_is_listed_here():
    assert set(ON_SIMULATED) == set(_stack.kinds())
    assert set(ON_DEVICE) == set(_stack.kinds()) - {"simulated"}


@pytest.mark.parametrize("kind", sorted(_stack.kinds()))
def test_every_kind_on_simulated_memory_comes_back_as_full_objects(kind):
    top = _stack.build(kind, simulate=1 << 30)
    check_full_objects(top, ON_SIMULATED[kind])
    # Set as the current resource, it comes back as the same objects.
    saved = mr.get_current_device_resource() if gpu_available() else None
    try:
        mr.set_current_device_resource(top)
        assert mr.get_current_device_resource() is top
        check_full_objects(mr.get_current_device_resource(), ON_SIMULATED[kind])
    finally:
        if saved is not None:
            mr.set_current_device_resource(saved)
        else:
            _rrmm._clear_per_device_resources()


@given(
    kind=st.sampled_from(sorted(_stack.kinds())),
    limit=st.none() | st.integers(64 * MiB, 1 << 30),
    logging=st.booleans(),
    statistics=st.booleans(),
    tracking=st.booleans(),
)
def test_adaptors_on_top_come_in_their_order_as_full_objects(
    tmp_path_factory, kind, limit, logging, statistics, tracking
):
    log_file = str(tmp_path_factory.mktemp("log") / "stack.csv")
    top = _stack.build(kind, simulate=1 << 30, allocation_limit=limit, logging=logging,
                       log_file=log_file, statistics=statistics, tracking=tracking)
    adaptors = [name for name, on in [("TrackingResourceAdaptor", tracking),
                                      ("StatisticsResourceAdaptor", statistics),
                                      ("LoggingResourceAdaptor", logging),
                                      ("LimitingResourceAdaptor", limit is not None)] if on]
    check_full_objects(top, adaptors + ON_SIMULATED[kind])
    if logging:
        # RMM's naming of the log file (the device's number before the extension).
        log = chain(top)[adaptors.index("LoggingResourceAdaptor")]
        assert log.get_file_name().endswith(".dev0.csv")


def test_a_misspelt_option_is_a_type_error_at_the_call():
    with pytest.raises(TypeError, match="initail_pool_size"):
        _stack.build("pool", simulate=1 << 30, initail_pool_size=MiB)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="unknown resource"):
        _stack.build("poool", simulate=1 << 30)
    with pytest.raises(ValueError, match="host_memory=4611686018427387904 bytes is more than "
                       "simulated memory can be"):
        _stack.build("fallback", simulate=1 << 30, host_memory=1 << 62)
    assert not hasattr(_rrmm, "_stack_plan")


def test_the_fallbacks_alternate_is_a_full_object():
    top = _stack.build("fallback", simulate=8 * MiB, initial_pool_size=4 * MiB)
    alternate = top.alternate_mr
    assert type(alternate) is mr.SimulatedMemoryResource
    ptrs = [top.allocate(3 * MiB) for _ in range(4)]  # past the 8 MiB device
    assert alternate.bytes_in_use() > 0 and top.counts()["fallbacks"] >= 1
    for p in ptrs:
        top.deallocate(p, 3 * MiB)


@pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
@pytest.mark.parametrize("kind", sorted(ON_DEVICE))
def test_reinitialize_with_every_kind_gives_full_objects_all_the_way_down(kind, tmp_path):
    sized = kind not in ("cuda", "managed", "pinned")
    try:
        rrmm.reinitialize(pool_allocator=kind, initial_pool_size=64 * MiB if sized else None)
        check_full_objects(mr.get_current_device_resource(), ON_DEVICE[kind])
        rrmm.reinitialize(pool_allocator=kind, initial_pool_size=64 * MiB if sized else None,
                          logging=True, log_file_name=str(tmp_path / "log.csv"))
        check_full_objects(mr.get_current_device_resource(),
                           ["LoggingResourceAdaptor"] + ON_DEVICE[kind])
    except MemoryError:
        pytest.skip("the device is too full for this kind")
    except RuntimeError as e:
        if kind == "tiered" and "no peer link" in str(e):
            pytest.skip(f"tiered needs a peer GPU: {e}")
        raise
    finally:
        rrmm.reinitialize()


def test_reinitialize_crosses_into_rust_once(monkeypatch):
    """Its arguments checked in Python, ``reinitialize`` makes one call into the extension:
    ``_reinitialize`` checks the devices, forgets the old resources, builds, wraps and sets the
    new ones (on the GPU), or says why there is no device (here)."""
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(_rrmm, name)
            if callable(attr):
                calls.append(name)
            return attr

    _stack.kinds()  # the kinds table is read from Rust once per process
    monkeypatch.setattr(rrmm.rmm, "_rrmm", Counting())
    monkeypatch.setattr(_stack, "_rrmm", Counting())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rrmm.reinitialize(pool_allocator=True, initial_pool_size=64 * MiB)
        # The arguments read (the one size reader) and the plan checked before the hooks run,
        # then one crossing that builds and sets the stack.
        assert calls == ["_read_size", "_check_stack", "_reinitialize"], calls
        if gpu_available():
            check_full_objects(mr.get_current_device_resource(), ON_DEVICE["pool"])
    finally:
        monkeypatch.undo()
        rrmm.reinitialize() if gpu_available() else _rrmm._clear_per_device_resources()


def test_stack_options_are_one_typed_value_with_unknown_names_refused() -> None:
    """Issue 36: the options of a stack kind are read once (``StackOptions``); every entry point
    takes the same names and refuses an unknown one as a misspelt keyword argument."""
    import pytest
    from rrmm import _rrmm

    top = _rrmm.build_stack("pool", simulate=1 << 30, initial_pool_size=1 << 20,
                            maximum_pool_size=None, statistics=True)
    assert type(top).__name__ == "StatisticsResourceAdaptor"
    for call in (lambda: _rrmm.build_stack("pool", simulate=1 << 30, intial_pool_size=1),
                 lambda: _rrmm.replay_logs([], ["pool"], simulate=1 << 30, bogus=1),
                 lambda: _rrmm.fit_logs([], ["pool"], bogus=1)):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            call()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="Could not parse 'big' as a byte specification for "
                       "initial_pool_size"):
        _rrmm.build_stack("pool", simulate=1 << 30, initial_pool_size="big")
