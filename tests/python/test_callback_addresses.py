"""The callback resource keeps the record of the addresses its functions return (issue 39):
a block that overlaps a live one is refused (RuntimeError, nothing uses or frees it), a free of
a block it did not hand out or with another size is refused, and the resource keeps working.
Generated: the allocate function returns addresses the test picks, against a model of the live
blocks."""

from __future__ import annotations

import pytest
import rrmm
from hypothesis import given, settings
from hypothesis import strategies as st

UNIT = 256


def _overlaps(live: dict[int, int], ptr: int, size: int) -> bool:
    return any(p < ptr + size and ptr < p + n for p, n in live.items())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 40), st.integers(1, 8)),
        min_size=1,
        max_size=40,
    )
)
def test_overlapping_blocks_are_refused_against_a_model(ops):
    picked: list[int] = []
    freed: list[tuple[int, int]] = []

    def allocate(size, stream):
        return picked.pop()

    def deallocate(ptr, size, stream):
        freed.append((ptr, size))

    mr = rrmm.mr.CallbackMemoryResource(allocate, deallocate)
    live: dict[int, int] = {}
    for is_alloc, slot, units in ops:
        ptr, size = slot * UNIT, units * UNIT
        if is_alloc:
            picked.append(ptr)
            if _overlaps(live, ptr, size):
                with pytest.raises(RuntimeError, match="overlaps the live block"):
                    mr.allocate(size)
            else:
                assert mr.allocate(size) == ptr
                live[ptr] = size
        elif live.get(ptr) == size:
            mr.deallocate(ptr, size)
            assert freed[-1] == (ptr, size)
            del live[ptr]
        else:
            before = len(freed)
            with pytest.raises(RuntimeError, match="deallocate of"):
                mr.deallocate(ptr, size)
            assert len(freed) == before, "a refused free calls nothing"
    for ptr, size in list(live.items()):
        mr.deallocate(ptr, size)


def test_a_pool_over_a_callback_that_returns_one_pointer_twice_never_overlaps():
    base = rrmm.mr.SimulatedMemoryResource("1GiB")
    first: list[int] = []

    def allocate(size, stream):
        if not first:
            first.append(base.allocate(size))
        return first[0]

    def deallocate(ptr, size, stream):
        base.deallocate(ptr, size)

    pool = rrmm.mr.PoolMemoryResource(
        rrmm.mr.CallbackMemoryResource(allocate, deallocate),
        initial_pool_size="1MiB",
        maximum_pool_size="4MiB",
    )
    a = pool.allocate(1 << 20)
    with pytest.raises((MemoryError, RuntimeError)):
        pool.allocate(1 << 20)  # the pool grows: the callback returns the live chunk again
    pool.deallocate(a, 1 << 20)
    b = pool.allocate(1 << 20)
    pool.deallocate(b, 1 << 20)
