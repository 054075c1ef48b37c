"""Memory that moves never loses a byte (issue 36), on the CPU: a Hypothesis state machine over
every stack kind a suballocator can make over an expandable pool on host memory with real bytes
(``pageable_host=True``): pool, a pool over a pool, fixed_size, binning and arena, with a
statistics adaptor between or on top, driven through the Python API (``DeviceBuffer`` objects
and raw allocations). It checks, at every sleep:

- a discard (``offload(discard=...)``, ``rrmm.sleep(discard=...)`` or ``tag(..., "discard")``)
  covers exactly the tagged block: every other block, the tagged block's neighbours in the same
  chunk of the pool included, keeps every byte;
- a sleep copies exactly the live blocks (a chunk's free ranges are not copied);
- the discards of one sleep are forgotten at its wake, ``tag()`` holds until the free;
- an offload refused for a buffer no pool holds changes nothing (nothing sleeps, no tag stays);
- while asleep: allocations and every copy of a buffer's bytes (``copy_to_host``,
  ``copy_from_host``, ``tobytes``, ``bytes()``, pickling, ``copy_from_device``) raise
  ``RuntimeError`` naming the sleep and touch nothing; ``memory_stats()`` counts nothing
  reserved and the held bytes as offloaded, and every level's snapshot marks its segments
  offloaded.
"""

from __future__ import annotations

import ctypes
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import rrmm
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from rrmm import _rrmm, mr

MiB = 1 << 20
PAGE = 2 * MiB

STACKS = {
    "pool": lambda up: mr.PoolMemoryResource(up, 4 * MiB),
    "pool(pool)": lambda up: mr.PoolMemoryResource(mr.PoolMemoryResource(up, 8 * MiB), 2 * MiB),
    "fixed_size": lambda up: mr.FixedSizeMemoryResource(up, 64 * 1024),
    "binning": lambda up: mr.BinningMemoryResource(up, 10, 16),
    "arena": lambda up: mr.ArenaMemoryResource(up, 16 * MiB),
}

# The largest request each stack serves here (fixed_size: one block).
LARGEST = {"fixed_size": 64 * 1024}


def pattern(size: int, seed: int) -> bytes:
    arr = ((np.arange(size, dtype=np.uint32) * 2654435761 + seed) >> 13).astype(np.uint8)
    return arr.tobytes()


def read(ptr: int, size: int) -> bytes:
    return ctypes.string_at(ptr, size)


@dataclass
class Block:
    buf: Any  # a DeviceBuffer, or None for a raw allocation
    ptr: int
    size: int
    data: bytes | None  # None: unknown (discarded by a sleep with the undefined fill)
    tagged: bool = False


class SleepStackMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.live: list[Block] = []
        self.seed = 0

    @initialize(kind=st.sampled_from(sorted(STACKS)),
                adaptor=st.sampled_from(["none", "under", "over"]))
    def build(self, kind: str, adaptor: str) -> None:
        self.pool = mr.ExpandableMemoryResource(
            reserve_size=512 * MiB, page_size=PAGE, pageable_host=True)
        under: Any = mr.StatisticsResourceAdaptor(self.pool) if adaptor == "under" else self.pool
        self.sub = STACKS[kind](under)
        self.top: Any = mr.StatisticsResourceAdaptor(self.sub) if adaptor == "over" else self.sub
        self.kind = kind
        self.largest = LARGEST.get(kind, PAGE)
        self.smallest_block = 64 * 1024 if kind == "fixed_size" else 4096

    @rule(size=st.integers(1, 70_000), raw=st.booleans())
    def allocate(self, size: int, raw: bool) -> None:
        size = min(size, self.largest)
        self.seed += 1
        data = pattern(size, self.seed)
        if raw:
            ptr = self.top.allocate(size)
            ctypes.memmove(ptr, data, size)
            self.live.append(Block(None, ptr, size, data))
        else:
            buf = rrmm.DeviceBuffer.to_device(data, mr=self.top)
            self.live.append(Block(buf, buf.ptr, size, data))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1 << 16))
    def free(self, i: int) -> None:
        b = self.live.pop(i % len(self.live))
        if b.buf is None:
            self.top.deallocate(b.ptr, b.size)
        # A DeviceBuffer frees itself when dropped.

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1 << 16), discard=st.booleans(), by_buffer=st.booleans())
    def tag(self, i: int, discard: bool, by_buffer: bool) -> None:
        b = self.live[i % len(self.live)]
        what = b.buf if by_buffer and b.buf is not None else b.ptr
        assert self.top.tag(what, "discard" if discard else "keep") == b.ptr
        b.tagged = discard

    @rule(picks=st.lists(st.integers(0, 1 << 16), max_size=3), zero=st.booleans(),
          bogus=st.booleans(), context=st.booleans())
    def sleep(self, picks: list[int], zero: bool, bogus: bool, context: bool) -> None:
        now = {p % len(self.live) for p in picks} if self.live else set()
        discard = [self.live[i].buf if self.live[i].buf is not None else self.live[i].ptr
                   for i in sorted(now)]
        fill = "zero" if zero else "undefined"
        if bogus:
            with pytest.raises(ValueError, match="live allocation"):
                self.top.offload(discard=[*discard, 12345], discard_fill=fill)
            assert not self.pool.asleep, "a refused offload changes nothing"
        kept = [b for i, b in enumerate(self.live) if i not in now and not b.tagged]
        estimate = self.top.sleep_estimate()
        if context:
            with rrmm.sleep(self.top, discard=discard, discard_fill=fill) as did:
                self.while_asleep(did, estimate, kept, now)
        else:
            did = self.top.offload(discard=discard, discard_fill=fill)
            self.while_asleep(did, estimate, kept, now)
            self.top.restore()
        for i, b in enumerate(self.live):
            gone = i in now or b.tagged
            if not gone:
                assert b.data is None or read(b.ptr, b.size) == b.data, (self.kind, i, b.size)
            elif zero:
                assert read(b.ptr, b.size) == bytes(b.size), (self.kind, i)
                b.data = bytes(b.size)
            else:
                b.data = None
        # This sleep's discards are forgotten; tags hold.
        again = self.top.sleep_estimate()
        tagged = [b for b in self.live if b.tagged]
        assert (again["discarded_bytes"] > 0) == bool(tagged)

    def while_asleep(self, did: dict[str, int], estimate: dict[str, int], kept: list[Block],
                     now: set[int]) -> None:
        assert self.pool.asleep and self.top.asleep and self.pool.mapped_bytes() == 0
        if not now:
            assert did == estimate
        # Exactly the live blocks kept: each at least what was asked, never a whole chunk.
        asked = sum(b.size for b in kept)
        assert asked <= did["copied_bytes"] <= sum(
            max(self.smallest_block, 1 << (b.size - 1).bit_length()) for b in kept), (did, asked)
        with pytest.raises(RuntimeError, match="asleep"):
            self.top.allocate(256)
        for b in self.live[:2]:
            self.copies_refused(b)
        for res in {id(r): r for r in (self.top, self.sub)}.values():
            stats = _rrmm._memory_stats(res)
            if stats is not None:
                assert stats["reserved_bytes.all.current"] == 0, stats
                assert stats["offloaded_bytes.all.current"] > 0, stats
            for seg in _rrmm._memory_snapshot(res, 0) or []:
                assert seg.get("offloaded"), (self.kind, seg)

    def copies_refused(self, b: Block) -> None:
        """Every copy of a sleeping buffer's bytes is a RuntimeError naming the sleep."""
        host = bytearray(b.size)
        other = rrmm.DeviceBuffer(size=b.size, mr=mr.SystemMemoryResource())
        calls: list[Any] = [lambda: _rrmm.copy_ptr_to_host(b.ptr, host),
                            lambda: _rrmm.copy_host_to_ptr(bytes(b.size), b.ptr),
                            lambda: _rrmm.copy_device_to_ptr(b.ptr, other.ptr, b.size),
                            lambda: other.copy_from_device(b.buf if b.buf else other)]
        if b.buf is not None:
            buf = b.buf
            calls += [buf.copy_to_host, lambda: buf.copy_from_host(bytes(b.size)), buf.tobytes,
                      lambda: bytes(buf), lambda: pickle.dumps(buf),
                      lambda: pickle.dumps(buf, protocol=5)]
        for i, call in enumerate(calls):
            if i == 3 and b.buf is None:
                continue
            with pytest.raises(RuntimeError, match="asleep"):
                call()

    @invariant()
    def awake(self) -> None:
        if hasattr(self, "pool"):
            assert not self.pool.asleep

    def teardown(self) -> None:
        for b in self.live:
            if b.buf is None:
                self.top.deallocate(b.ptr, b.size)
        self.live.clear()


SleepStackMachine.TestCase.settings = settings(
    settings.get_profile("ci"), max_examples=40, stateful_step_count=20, deadline=None
)
TestSleepStackMachine = SleepStackMachine.TestCase


@pytest.mark.parametrize("kind", sorted(STACKS))
def test_a_discard_keeps_its_neighbours_in_the_same_chunk(kind: str) -> None:
    """The reported case: two blocks carved from one chunk, one discarded; the other keeps its
    bytes (it read zeros on two H200s through a pool over the expandable pool)."""
    pool = mr.ExpandableMemoryResource(reserve_size=256 * MiB, page_size=PAGE, pageable_host=True)
    top = STACKS[kind](pool)
    a = rrmm.DeviceBuffer.to_device(b"\x01" * 4096, mr=top)
    b = rrmm.DeviceBuffer.to_device(b"\x02" * 4096, mr=top)
    block = 64 * 1024 if kind == "fixed_size" else 4096  # the block each hands out
    did = top.offload(discard=[a], discard_fill="zero")
    assert did["discarded_bytes"] == block and did["copied_bytes"] == block
    top.restore()
    assert bytes(b) == b"\x02" * 4096
    assert bytes(a) == bytes(4096)
    # The discard was this sleep's only: the next sleep keeps a.
    a.copy_from_host(b"\x03" * 4096)
    with rrmm.sleep(top) as again:
        assert again["discarded_bytes"] == 0
    assert bytes(a) == b"\x03" * 4096 and bytes(b) == b"\x02" * 4096


def test_sleep_takes_a_resource() -> None:
    with pytest.raises(TypeError, match="memory resource"), rrmm.sleep(42):  # type: ignore[arg-type]
        pass


def test_a_tag_of_an_int_that_is_no_address_says_so() -> None:
    pool = mr.ExpandableMemoryResource(reserve_size=64 * MiB, page_size=PAGE, pageable_host=True)
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError, match="is not an address"):
            pool.tag(bad)
