"""Sleep and wake of the expandable pool (issue 32) on the CPU: a Hypothesis state machine over
an expandable pool on plain host memory (``pageable_host=True``: real bytes) or simulated
virtual memory, directly or under a statistics adaptor, drives allocations, frees, tags and
sleeps, with allocations and frees from threads racing the sleeps, and checks after each wake:

- every live block is still allocated at its address and, unless tagged discard, holds the
  bytes written into it (discarded blocks read zeros with ``discard_fill="zero"``);
- while asleep nothing is mapped, allocations raise RuntimeError naming the sleep, frees work;
- what ``offload()`` reports is what ``sleep_estimate()`` predicted, and the bytes copied are
  the kept blocks' bytes.

The GPU side (40 GiB of CuPy arrays, a second process, PyTorch and CUDA graphs) is
``benches/gpu/sleep_wake.py``.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import rrmm
from conftest import gpu_available, gpu_skip_reason
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from rrmm import _rrmm, mr

MiB = 1 << 20
PAGE = 2 * MiB


def pageable_pool(**kw: Any) -> mr.ExpandableMemoryResource:
    return mr.ExpandableMemoryResource(
        reserve_size=512 * MiB, page_size=PAGE, pageable_host=True, **kw
    )


def pattern(size: int, seed: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.uint32) * 2654435761 + seed) >> 13).astype(np.uint8)


def write(ptr: int, data: np.ndarray) -> None:
    ctypes.memmove(ptr, data.ctypes.data, data.nbytes)


def read(ptr: int, size: int) -> np.ndarray:
    return np.frombuffer(ctypes.string_at(ptr, size), dtype=np.uint8)


@dataclass
class Block:
    ptr: int
    size: int
    seed: int | None  # None: unknown (discarded by a sleep)
    discard: bool = False


class SleepMachine(RuleBasedStateMachine):
    """The model: the live blocks, their seeds and tags."""

    def __init__(self) -> None:
        super().__init__()
        self.live: list[Block] = []
        self.seed = 0

    @initialize(backing=st.sampled_from(["pageable", "simulated"]), adapted=st.booleans())
    def build(self, backing: str, adapted: bool) -> None:
        if backing == "pageable":
            self.pool = pageable_pool()
        else:
            self.pool = mr.ExpandableMemoryResource(simulated_capacity=256 * MiB, page_size=PAGE)
        self.bytes = backing == "pageable"
        self.top: Any = mr.StatisticsResourceAdaptor(self.pool) if adapted else self.pool

    @rule(size=st.one_of(st.integers(1, 8192), st.integers(1, 3 * PAGE)))
    def allocate(self, size: int) -> None:
        ptr = self.top.allocate(size)
        self.seed += 1
        if self.bytes:
            write(ptr, pattern(size, self.seed))
        self.live.append(Block(ptr, size, self.seed))

    @rule(i=st.integers(0, 1 << 16))
    def free(self, i: int) -> None:
        if self.live:
            b = self.live.pop(i % len(self.live))
            self.top.deallocate(b.ptr, b.size)

    @rule(i=st.integers(0, 1 << 16), keep=st.booleans(),
          where=st.sampled_from(["start", "middle", "last"]))
    def tag(self, i: int, keep: bool, where: str) -> None:
        if self.live:
            b = self.live[i % len(self.live)]
            # Any address inside the block tags all of it (the start is found by a lookup,
            # another address through the ordered view of the blocks).
            at = {"start": 0, "middle": (b.size - 1) // 2, "last": b.size - 1}[where]
            start = self.top.tag(b.ptr + at, "keep" if keep else "discard")
            assert start == b.ptr
            b.discard = not keep

    @rule(zero=st.booleans(), free_asleep=st.none() | st.integers(0, 1 << 16),
          context=st.booleans())
    def sleep(self, zero: bool, free_asleep: int | None, context: bool) -> None:
        estimate = self.top.sleep_estimate()
        fill = "zero" if zero else "undefined"
        if context:
            with rrmm.sleep(self.top, discard_fill=fill) as did:
                self.while_asleep(did, estimate, free_asleep)
        else:
            did = self.top.offload(discard_fill=fill)
            self.while_asleep(did, estimate, free_asleep)
            self.top.restore()
        assert not self.top.asleep
        self.check_segments(asleep=False)
        self.check_bytes(zero)
        self.forget_discarded()

    def while_asleep(self, did: dict[str, int], estimate: dict[str, int],
                     free_asleep: int | None) -> None:
        assert did == estimate
        assert did["live_blocks"] == len(self.live)
        assert self.top.asleep and self.pool.asleep
        assert self.pool.mapped_bytes() == 0
        assert self.pool.sleep_estimate()["released_bytes"] == 0
        self.check_segments(asleep=True)
        if self.bytes:
            assert self.pool.host_copy_bytes() == did["copied_bytes"]
        with pytest.raises(RuntimeError, match="asleep"):
            self.top.allocate(256)
        with pytest.raises(RuntimeError, match="asleep already"):
            self.top.offload()
        if free_asleep is not None and self.live:
            b = self.live.pop(free_asleep % len(self.live))
            self.top.deallocate(b.ptr, b.size)

    def check_segments(self, asleep: bool) -> None:
        """The snapshot's segments are marked offloaded exactly while the pool sleeps, and every
        live block is still in them (its address kept)."""
        segments = _rrmm._memory_snapshot(self.top, 0) or []
        assert all(bool(s.get("offloaded")) == asleep for s in segments), segments
        allocated = {b["address"] for s in segments for b in s["blocks"]
                     if b["state"] == "active_allocated"}
        assert allocated == {b.ptr for b in self.live}

    def forget_discarded(self) -> None:
        """After a sleep a discarded block's bytes are the fill's, not the model's."""
        for b in self.live:
            if b.discard:
                b.seed = None

    def check_bytes(self, zero: bool) -> None:
        if not self.bytes:
            return
        for b in self.live:
            if not b.discard and b.seed is not None:
                assert np.array_equal(read(b.ptr, b.size), pattern(b.size, b.seed)), b
            elif zero:
                assert not read(b.ptr, b.size).any(), b

    @rule(threads=st.integers(2, 4), sleeps=st.integers(1, 4))
    def threads_race_sleeps(self, threads: int, sleeps: int) -> None:
        """Threads allocate and free (touching no memory) while this thread sleeps and wakes the
        pool: allocations either succeed or meet the sleep; frees always work."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def work(t: int) -> None:
            held: list[tuple[int, int]] = []
            n = 0
            try:
                while not stop.is_set() or held:
                    n += 1
                    if not stop.is_set():
                        size = 256 + (n * 7919 + t * 104729) % (PAGE // 2)
                        try:
                            held.append((self.top.allocate(size), size))
                        except RuntimeError as e:
                            assert "asleep" in str(e), e
                    if len(held) > 3 or (stop.is_set() and held):
                        p, s = held.pop(0)
                        self.top.deallocate(p, s)
            except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
                errors.append(e)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        # The race is inside offload() and restore(), which release the GIL. Between them this
        # thread waits for the GIL while the workers spin: 0.1 ms at most here, not Python's
        # 5 ms, which made the rule cost 2.5 times the CPU for the same races.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-4)
        for w in workers:
            w.start()
        try:
            for _ in range(sleeps):
                self.top.offload()
                self.top.restore()
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=60)
            sys.setswitchinterval(interval)
        assert not any(w.is_alive() for w in workers), "a worker hung"
        if errors:
            raise errors[0]
        self.check_bytes(False)
        self.forget_discarded()

    @invariant()
    def awake_between_steps(self) -> None:
        if hasattr(self, "pool"):
            assert not self.pool.asleep

    def teardown(self) -> None:
        if hasattr(self, "top"):
            for b in self.live:
                self.top.deallocate(b.ptr, b.size)


SleepMachine.TestCase.settings = settings(
    settings.get_profile("ci"), max_examples=40, stateful_step_count=25, deadline=None
)
TestSleepMachine = SleepMachine.TestCase


SUBALLOCATORS_OVER_THE_POOL = {
    "pool": lambda up: mr.PoolMemoryResource(up, 4 * MiB),
    "fixed_size": lambda up: mr.FixedSizeMemoryResource(up, 64 * 1024),
    "binning": lambda up: mr.BinningMemoryResource(up, 10, 16),
    "arena": lambda up: mr.ArenaMemoryResource(up, 8 * MiB),
    "statistics(pool)": lambda up: mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(up, 4 * MiB)),
}


@pytest.mark.parametrize("kind", sorted(SUBALLOCATORS_OVER_THE_POOL))
@given(sizes=st.lists(st.integers(1, 64 * 1024), min_size=1, max_size=12),
       frees=st.lists(st.integers(0, 1 << 16), max_size=6))
def test_a_suballocator_over_a_sleeping_pool_hands_out_nothing_until_the_wake(
    kind: str, sizes: list[int], frees: list[int]
) -> None:
    """A suballocator over an expandable pool caches free ranges of the pool's blocks; while the
    pool sleeps their pages are gone, so the suballocator refuses every allocation (as the pool
    does: RuntimeError naming the sleep), even one its cache could serve. Frees work while
    asleep, and after the wake the live blocks hold their bytes and allocation works again."""
    pool = pageable_pool()
    top = SUBALLOCATORS_OVER_THE_POOL[kind](pool)
    live = []
    for seed, size in enumerate(sizes):
        ptr = top.allocate(size)
        write(ptr, pattern(size, seed))
        live.append((ptr, size, seed))
    spare = top.allocate(256)
    top.deallocate(spare, 256)  # a cached free block the suballocator could hand out again
    with rrmm.sleep(top):
        assert pool.asleep and pool.mapped_bytes() == 0
        for size in (256, 4096, 64 * 1024):
            with pytest.raises(RuntimeError, match="asleep"):
                top.allocate(size)
        for i in frees:
            if live:
                ptr, size, _ = live.pop(i % len(live))
                top.deallocate(ptr, size)
    for ptr, size, seed in live:
        assert np.array_equal(read(ptr, size), pattern(size, seed)), (kind, ptr, size)
    again = top.allocate(256)
    write(again, pattern(256, 99))
    assert np.array_equal(read(again, 256), pattern(256, 99))
    top.deallocate(again, 256)
    for ptr, size, _ in live:
        top.deallocate(ptr, size)


def test_sleep_defaults_to_the_current_device_resource() -> None:
    pool = pageable_pool()
    mr.set_current_device_resource(pool)
    try:
        buf = rrmm.DeviceBuffer(size=PAGE + 5)
        write(buf.ptr, pattern(buf.size, 9))
        with rrmm.sleep(discard=[]) as did:
            assert pool.asleep and did["copied_bytes"] >= buf.size
        assert np.array_equal(read(buf.ptr, buf.size), pattern(buf.size, 9))
        report = pool.last_sleep()
        assert report is not None and report["sleeps"] == 1 and report["restore_s"] is not None
        del buf
    finally:
        _rrmm._clear_per_device_resources()


def test_discard_takes_buffers_and_pointers() -> None:
    pool = pageable_pool()
    keep = rrmm.DeviceBuffer(size=4096, mr=pool)
    lose = rrmm.DeviceBuffer(size=3 * PAGE, mr=pool)
    write(keep.ptr, pattern(4096, 1))
    write(lose.ptr, pattern(lose.size, 2))
    est = pool.sleep_estimate()
    assert est["copied_bytes"] >= 4096 + 3 * PAGE
    did = pool.offload(discard=[lose], discard_fill="zero")
    assert did["discarded_bytes"] >= 3 * PAGE and did["copied_bytes"] < 3 * PAGE
    pool.restore()
    assert np.array_equal(read(keep.ptr, 4096), pattern(4096, 1))
    assert not read(lose.ptr, lose.size).any()
    with pytest.raises(ValueError, match="not a sleep tag"):
        pool.tag(keep, "lose")
    with pytest.raises(ValueError, match="discard fill"):
        pool.offload(discard_fill="ones")
    assert not pool.asleep
    with pytest.raises(ValueError, match="live allocation"):
        pool.tag(12345)
    with pytest.raises(TypeError, match="not a device pointer"):
        pool.tag(object())


def test_resources_not_on_virtual_memory_refuse_by_name() -> None:
    for res in (mr.SystemMemoryResource(),
                mr.StatisticsResourceAdaptor(mr.SimulatedMemoryResource(1 << 30))):
        with pytest.raises(RuntimeError, match="sleep needs a pool on virtual memory"):
            res.offload()
        with pytest.raises(RuntimeError, match="sleep needs"):
            res.sleep_estimate()
        assert not res.asleep
    pool = pageable_pool()
    with pytest.raises(RuntimeError, match="awake"):
        pool.restore()


def test_every_sleep_after_the_first_takes_ready_host_pages_by_default() -> None:
    rrmm.host_pages.give_back()
    pool = pageable_pool()
    buf = rrmm.DeviceBuffer(size=2 * PAGE, mr=pool)
    for sleep in range(3):
        pool.offload()
        pool.restore()
        report = pool.last_sleep()
        assert report is not None and report["host_reused"] == (sleep > 0)
    # Given back to the OS at every wake when asked: every sleep makes its pages.
    pool.set_retain_host_copy(False)
    assert rrmm.host_pages.figures()["free_bytes"] == 0
    pool.offload()
    pool.restore()
    report = pool.last_sleep()
    assert report is not None and not report["host_reused"]
    assert rrmm.host_pages.figures()["free_bytes"] == 0
    del buf


def test_pages_made_ready_ahead_serve_the_first_sleep() -> None:
    rrmm.host_pages.give_back()
    pool = pageable_pool()
    buf = rrmm.DeviceBuffer(size=3 * PAGE, mr=pool)
    asked = pool.prepare_sleep(wait=True)
    assert asked >= 3 * PAGE
    made = rrmm.host_pages.figures()
    assert made["free_bytes"] >= asked and made["preparing_bytes"] == 0
    pool.offload()
    report = pool.last_sleep()
    assert report is not None and report["host_reused"], "the first sleep found its pages ready"
    assert rrmm.host_pages.figures()["made_ranges"] == made["made_ranges"]
    pool.restore()
    del buf


def test_pages_kept_ready_as_the_pool_grows_serve_the_first_sleep() -> None:
    rrmm.host_pages.give_back()
    made = rrmm.host_pages.figures()["made_ranges"]
    pool = pageable_pool()
    assert pool.keep_sleep_ready() == 0, "nothing mapped yet"
    bufs = [rrmm.DeviceBuffer(size=3 * PAGE, mr=pool) for _ in range(5)]
    rrmm.host_pages.wait()
    f = rrmm.host_pages.figures()
    assert f["free_bytes"] >= 15 * PAGE and f["made_ranges"] - made <= 6, f
    pool.offload()
    report = pool.last_sleep()
    assert report is not None and report["host_reused"], "ready before the first sleep"
    pool.restore()
    assert pool.keep_sleep_ready(False) == 0
    del bufs


def test_reinitialize_keeps_sleep_ready_only_for_a_pool_that_can_sleep() -> None:
    with pytest.raises(ValueError, match="keep_sleep_ready=True needs a pool that can sleep"):
        rrmm.reinitialize(pool_allocator=True, keep_sleep_ready=True)


def test_the_supply_is_bounded_and_gives_back_on_request() -> None:
    rrmm.host_pages.give_back()
    rrmm.host_pages.prepare("8MiB", kind="plain", wait=True)
    assert rrmm.host_pages.figures()["free_bytes"] >= 8 * MiB
    rrmm.host_pages.set_keep_limit("4MiB")
    assert rrmm.host_pages.figures()["free_bytes"] <= 4 * MiB
    rrmm.host_pages.set_keep_limit(None)
    rrmm.host_pages.prepare("2MiB", kind="plain", wait=True)
    assert rrmm.host_pages.give_back() >= 2 * MiB
    assert rrmm.host_pages.figures()["free_bytes"] == 0
    with pytest.raises(ValueError, match="kind must be"):
        rrmm.host_pages.prepare("1MiB", kind="paged")  # type: ignore[arg-type]
    # More than the host has: nothing is made, nothing is held.
    rrmm.host_pages.prepare("1PiB", kind="plain", wait=True)
    assert rrmm.host_pages.figures()["free_bytes"] == 0


@pytest.mark.skipif(not gpu_available(), reason=gpu_skip_reason())
def test_gpu_device_buffers_keep_their_bytes_and_addresses() -> None:
    pool = mr.ExpandableMemoryResource()
    top = mr.StatisticsResourceAdaptor(pool)
    data = [bytes([i + 1]) * (i * 5 * MiB + 1000) for i in range(4)]
    bufs = [rrmm.DeviceBuffer.to_device(d, mr=top) for d in data]
    ptrs = [b.ptr for b in bufs]
    with rrmm.sleep(top, discard=[bufs[3]], discard_fill="zero") as did:
        assert pool.asleep and pool.mapped_bytes() == 0
        assert did["discarded_bytes"] >= len(data[3])
        report = pool.last_sleep()
        assert report is not None and report["host_pinned"]
    assert [b.ptr for b in bufs] == ptrs
    for i, (b, d) in enumerate(zip(bufs, data, strict=True)):
        want = bytes(len(d)) if i == 3 else d
        assert bytes(b.copy_to_host()) == want
