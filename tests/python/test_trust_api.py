"""Reproducers of issue 29's API findings: errors that named the wrong cause, arguments accepted
that RMM (or PyTorch, for the memory history) refuses, and reference cycles through callbacks
whose memory was kept for ever."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import rrmm
from hypothesis import given
from hypothesis import strategies as st
from rrmm import _rrmm, mr
from rrmm.pylibrmm.device_buffer import copy_device_to_ptr, copy_host_to_ptr, copy_ptr_to_host

MAX_DEPTH = 256


def _stack(depth: int) -> Any:
    top = mr.SimulatedMemoryResource(1 << 30)
    for _ in range(depth - 1):
        top = mr.StatisticsResourceAdaptor(top)
    return top


def test_the_deepest_stack_rrmm_builds_can_be_set_as_current() -> None:
    """A 256-deep stack is within rrmm's limit: it can be set (was refused as 'mr must be a
    DeviceMemoryResource', checked as if a level were built over it)."""
    top = _stack(MAX_DEPTH)
    with pytest.raises(ValueError, match=r"257 resources deep.*at most 256"):
        mr.StatisticsResourceAdaptor(top)
    try:
        mr.set_per_device_resource(0, top)
        assert mr.get_per_device_resource(0) is top
        buf = rrmm.DeviceBuffer(size=64, mr=top)
        del buf
    finally:
        _rrmm._clear_per_device_resources()


@pytest.mark.parametrize("bad", [None, 3, "pool", object()])
def test_setting_a_non_resource_names_the_type(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"mr must be a DeviceMemoryResource, not (None|int|str|object)"):
        mr.set_per_device_resource(0, bad)


@given(
    ptr=st.integers(min_value=2**64 - 2**20, max_value=2**64 - 1),
    extra=st.integers(min_value=1, max_value=2**20),
)
def test_a_range_that_wraps_past_the_address_space_says_so(ptr: int, extra: int) -> None:
    """Raw copies whose range wraps past 2**64 (was: 'is simulated memory')."""
    nbytes = (2**64 - ptr) + extra  # ends `extra` bytes past 2**64
    host = np.zeros(nbytes if nbytes <= 2**21 else 16, dtype=np.uint8)
    if host.size != nbytes:
        return
    for call in (
        lambda: copy_ptr_to_host(ptr, host),
        lambda: copy_host_to_ptr(host, ptr),
    ):
        with pytest.raises(ValueError, match=r"wraps past the end of the address space"):
            call()


def test_a_wrapping_device_to_device_copy_says_so() -> None:
    src = rrmm.DeviceBuffer(size=64, mr=mr.SystemMemoryResource())
    with pytest.raises(ValueError, match=r"wraps past the end of the address space"):
        copy_device_to_ptr(src.ptr, 2**64 - 16, 64)
    with pytest.raises(ValueError, match=r"wraps past the end of the address space"):
        copy_device_to_ptr(2**64 - 16, src.ptr, 64)


DEVICE_KINDS = {
    "simulated": lambda: mr.SimulatedMemoryResource(1 << 30),
    "managed-simulated": lambda: mr.SimulatedMemoryResource(1 << 30, host_memory=1 << 30),
    "callback": lambda: mr.CallbackMemoryResource(lambda n, s: 0, lambda p, n, s: None),
    "pool-over-simulated": lambda: mr.PoolMemoryResource(mr.SimulatedMemoryResource(1 << 30), 1 << 20),
}


@pytest.mark.parametrize("make", list(DEVICE_KINDS.values()), ids=list(DEVICE_KINDS))
def test_the_host_resource_setters_refuse_device_kinds(make: Any) -> None:
    before = mr.get_current_host_resource()
    r = make()
    with pytest.raises(ValueError, match=r"host cannot read|host can read"):
        mr.set_current_host_resource(r)
    with pytest.raises(ValueError, match=r"host can read and write"):
        _rrmm._set_current_host_resource(r)
    assert mr.get_current_host_resource() is before
    system = mr.SystemMemoryResource()
    mr.set_current_host_resource(system)
    try:
        assert mr.get_current_host_resource() is system
        assert rrmm.HostBuffer(64).size == 64
    finally:
        mr.set_current_host_resource(None)


@pytest.mark.parametrize("enabled", [1, 0, 1.0, b"all", ["all"]])
def test_record_memory_history_refuses_what_pytorch_refuses(enabled: Any) -> None:
    """PyTorch's ``_record_memory_history`` takes None, 'state', 'all', True and False; an int is
    a TypeError (its binding takes an optional string), not True."""
    with pytest.raises(TypeError, match=r"enabled must be"):
        rrmm.record_memory_history(enabled)


@pytest.mark.parametrize("enabled", ["all", "state", True, None, False])
def test_record_memory_history_takes_what_pytorch_takes(enabled: Any) -> None:
    try:
        rrmm.record_memory_history(enabled)
    finally:
        rrmm.record_memory_history(None)


def test_record_memory_history_refuses_unknown_strings_and_int_stacks() -> None:
    with pytest.raises(ValueError, match=r"enabled must be"):
        rrmm.record_memory_history("yes")
    with pytest.raises(TypeError, match=r"stacks must be"):
        rrmm.record_memory_history("all", stacks=1)  # type: ignore[arg-type]
    rrmm.record_memory_history(None)


@pytest.mark.parametrize("size", [2**64, 2**70, 2**100])
@pytest.mark.parametrize("arg", ["initial_pool_size", "maximum_pool_size", "pinned_pool_size"])
def test_reinitialize_refuses_sizes_past_the_address_space_with_or_without_a_gpu(
    arg: str, size: int
) -> None:
    """Was accepted with only a warning where no GPU is present."""
    with pytest.raises(OverflowError, match=r"size_t|address space"):
        rrmm.reinitialize(pool_allocator=True, **{arg: size})


DEVICE_FUNCTIONS = {
    "memory_stats": lambda d: rrmm.statistics.memory_stats(d),
    "memory_snapshot": lambda d: rrmm.memory_snapshot(d),
    "memory_summary": lambda d: rrmm.memory_summary(d),
}


@pytest.mark.parametrize("device", ["0", 0.0, 0.5, b"0"], ids=repr)
@pytest.mark.parametrize("call", list(DEVICE_FUNCTIONS.values()), ids=list(DEVICE_FUNCTIONS))
def test_device_arguments_are_not_coerced_by_int(call: Any, device: Any) -> None:
    with pytest.raises(TypeError, match=r"device must be an int"):
        call(device)


@pytest.mark.parametrize("device", [0, np.int64(0), np.uint8(0)], ids=repr)
@pytest.mark.parametrize("call", list(DEVICE_FUNCTIONS.values()), ids=list(DEVICE_FUNCTIONS))
def test_device_arguments_take_ints_and_numpy_integers(call: Any, device: Any) -> None:
    mr.set_per_device_resource(0, mr.PoolMemoryResource(mr.SimulatedMemoryResource(1 << 30), 1 << 20))
    try:
        call(device)
    finally:
        _rrmm._clear_per_device_resources()


# ---------------------------------------------------------------------------------------------
# Reference cycles through a CallbackMemoryResource's functions: collected, and the memory held
# through the callbacks given back (was: collected, the frees failing with "the deallocate_func
# of this resource is gone", 1 MiB kept for ever by the pool's upstream).


class _Sentinel:
    pass


def _cycle(shape: str, sim: Any) -> weakref.ref[_Sentinel]:
    """Builds a cycle of `shape` whose callbacks refer back to what sits on the resource; returns
    a weak reference to a sentinel inside the cycle."""
    s = _Sentinel()
    box: list[Any] = [s]

    def alloc(n: int, stream: Any) -> int:
        assert box
        return sim.allocate(n, stream)

    def dealloc(p: int, n: int, stream: Any) -> None:
        assert box
        sim.deallocate(p, n, stream)

    cb = mr.CallbackMemoryResource(alloc, dealloc)
    if shape == "resource":
        box.append(cb)
    elif shape == "buffer":
        box.append(rrmm.DeviceBuffer(size=1 << 20, mr=cb))
    elif shape == "raw":
        box.append((cb, cb.allocate(1 << 20)))
    elif shape == "pool":
        box.append(mr.PoolMemoryResource(cb, initial_pool_size=1 << 20))
    elif shape == "pool+buffers":
        pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
        box.append([rrmm.DeviceBuffer(size=3 << 20, mr=pool) for _ in range(3)])
    elif shape == "stack":
        top = mr.StatisticsResourceAdaptor(
            mr.LimitingResourceAdaptor(mr.PoolMemoryResource(cb, 1 << 20), 1 << 30)
        )
        box.append(rrmm.DeviceBuffer(size=5 << 20, mr=top))
    elif shape == "binning":
        binning = mr.BinningMemoryResource(sim)
        binning.add_bin(1 << 16, cb)
        box.append([rrmm.DeviceBuffer(size=1 << 16, mr=binning) for _ in range(4)])
    elif shape == "fallback":
        fb = mr.FallbackResourceAdaptor(mr.SimulatedMemoryResource(1 << 20), cb)
        box.append(rrmm.DeviceBuffer(size=2 << 20, mr=fb))
    else:
        raise AssertionError(shape)
    return weakref.ref(s)


CYCLE_SHAPES = ["resource", "buffer", "raw", "pool", "pool+buffers", "stack", "binning", "fallback"]


def _refusing_cycle(
    sim: Any, bad: int, live: int, freed: list[int], fail_frees: bool = False
) -> tuple[weakref.ref[Any], list[int]]:
    """A callback resource whose functions refer to it (a cycle only the collector frees), whose
    allocate answers ``bad`` above 4 KiB; one refused request and ``live`` accepted ones. With
    ``fail_frees`` its deallocate frees, then raises."""
    box: list[Any] = []

    def allocate(nbytes: int, stream: Any) -> int:
        assert box
        return bad if nbytes > 4096 else int(sim.allocate(nbytes, stream))

    def deallocate(ptr: int, nbytes: int, stream: Any) -> None:
        freed.append(ptr)
        sim.deallocate(ptr, nbytes, stream)
        if fail_frees:
            raise KeyError("free failed at collection")

    class Holder:
        cb: Any

    holder = Holder()
    holder.cb = mr.CallbackMemoryResource(allocate, deallocate)
    box.append(holder)
    with pytest.raises(RuntimeError, match="does not use or free it"):
        holder.cb.allocate(1 << 20)
    accepted = [int(holder.cb.allocate(256)) for _ in range(live)]
    return weakref.ref(holder), accepted


@pytest.fixture
def earlier_garbage_collected() -> Iterator[None]:
    """Collects what earlier tests left for the collector, once before a test that listens for
    unraisable errors during its own collections (once, not per Hypothesis example): those
    errors are not the test's. What is left is frozen (``gc.freeze``) until the test ends: the
    test's collections then go over what the test made, not over the worker's whole heap (0.1 s
    each, most of these tests' time)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _collect_listening_for_unraisables() -> list[Any]:
    """Runs a full collection and returns what reached ``sys.unraisablehook`` meanwhile."""
    seen: list[Any] = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        gc.collect()
    finally:
        sys.unraisablehook = old
    return seen


@pytest.mark.usefixtures("earlier_garbage_collected")
@given(bad=st.sampled_from([0x1001, 0x1080, (1 << 64) - 256]), live=st.integers(0, 3))
def test_a_refused_address_is_never_given_back_when_a_cycle_is_collected(
    bad: int, live: int
) -> None:
    """An allocate function's misaligned (or wrapping) answer is refused and is not live: when a
    cycle through the functions is collected, the deallocate function gets back exactly what
    rrmm accepted from it (CI once saw a refused 0x1001 reach a deallocate function)."""
    sim = mr.SimulatedMemoryResource(1 << 30)
    freed: list[int] = []
    ref, accepted = _refusing_cycle(sim, bad, live, freed)
    seen = _collect_listening_for_unraisables()
    assert ref() is None, "the cycle was not collected"
    assert not seen, [u.exc_value for u in seen]
    assert sorted(freed) == sorted(accepted)
    assert sim.bytes_in_use() == 0


@pytest.mark.usefixtures("earlier_garbage_collected")
def test_a_free_that_raises_when_a_cycle_is_collected_is_reported_with_its_function() -> None:
    sim = mr.SimulatedMemoryResource(1 << 30)
    freed: list[int] = []
    ref, accepted = _refusing_cycle(sim, 0x1001, 2, freed, fail_frees=True)
    seen = _collect_listening_for_unraisables()
    assert ref() is None and sorted(freed) == sorted(accepted)
    assert len(seen) == 2 and all("free failed at collection" in str(u.exc_value) for u in seen)
    # "Exception ignored in: <function ... deallocate ...>", not None.
    assert all(callable(u.object) and u.object.__name__ == "deallocate" for u in seen)


@pytest.mark.usefixtures("earlier_garbage_collected")
@given(shapes=st.lists(st.sampled_from(CYCLE_SHAPES), min_size=1, max_size=4))
def test_cycles_through_callbacks_are_collected_and_their_memory_given_back(
    shapes: list[str],
) -> None:
    sim = mr.SimulatedMemoryResource(1 << 34)
    seen: list[Any] = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        refs = [_cycle(shape, sim) for shape in shapes]
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert all(r() is None for r in refs), "a cycle through the callbacks was not collected"
    assert not seen, [u.exc_value for u in seen]
    assert sim.bytes_in_use() == 0, f"{sim.bytes_in_use()} bytes kept by collected cycles"
    assert sim.live_allocations() == 0


def test_a_callback_resource_dropped_the_ordinary_way_keeps_its_functions() -> None:
    """No cycle: what still holds the Rust resource (here a pool made over it, through its
    DeviceBuffer) keeps calling the functions."""
    sim = mr.SimulatedMemoryResource(1 << 30)
    cb = mr.CallbackMemoryResource(lambda n, s: sim.allocate(n, s), sim.deallocate)
    buf = rrmm.DeviceBuffer(size=1 << 20, mr=mr.PoolMemoryResource(cb, 1 << 20))
    del cb
    gc.collect()
    assert sim.bytes_in_use() > 0
    del buf
    gc.collect()
    assert sim.bytes_in_use() == 0


def test_a_collected_cycle_leaves_hook_memory_alone(child: Any) -> None:
    """A framework hook's allocation holds the chain from outside Python's sight: the collected
    cycle's memory stays (its later frees fail cleanly, reported), never freed under the hook."""
    child(
        """
import gc
sim = mr.SimulatedMemoryResource(1 << 34)
box = []
cb = mr.CallbackMemoryResource(lambda n, s: (box, sim.allocate(n, s))[1],
                               lambda p, n, s: (box, sim.deallocate(p, n, s)))
pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
box.append(pool)
mr.set_current_device_resource(pool)
a = _rrmm.hook_allocate(4096, 0, 0)
_rrmm._clear_per_device_resources()
del cb, pool, box
gc.collect()
assert sim.bytes_in_use() == 1 << 20, sim.bytes_in_use()
a.free()  # back into the pool, which the hook allocation keeps alive
assert sim.bytes_in_use() == 1 << 20
del a  # the pool goes: its chunk cannot go back through the dead callbacks (reported)
gc.collect()
assert sim.bytes_in_use() == 1 << 20
print("CHILD OK")
"""
    )
