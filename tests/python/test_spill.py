"""Spilling to host pages and promotion back (issue 37) on the CPU: a Hypothesis state machine
over an expandable pool on plain host memory that pretends to be a small device
(``pageable_host=True, device_capacity=..., spill_to_host=...``: real bytes), directly or under
a statistics adaptor, drives allocations, frees, promotions (all, one buffer's, a byte limit),
trims and sleeps, and checks after every step:

- every live block holds the bytes written into it, at its address;
- the pages standing for the device never pass its capacity;
- ``spilled_bytes()``, ``spill_figures()`` and the promotion's report agree, and host pages
  are never more than the limit;
- a promotion with no limit leaves pages spilled only when the device is full.

The GPU side (W11 beyond VRAM, reuse after promotion) is ``benches/gpu/spill_promote.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import rrmm
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from rrmm import _rrmm, mr
from test_sleep import pattern, read, write

MiB = 1 << 20
PAGE = 2 * MiB
DEVICE_PAGES = 6
SPILL_PAGES = 10


def spilling_pool(**kw: Any) -> mr.ExpandableMemoryResource:
    return mr.ExpandableMemoryResource(
        reserve_size=64 * PAGE,
        page_size=PAGE,
        pageable_host=True,
        device_capacity=DEVICE_PAGES * PAGE,
        spill_to_host=SPILL_PAGES * PAGE,
        **kw,
    )


class SpillMachine(RuleBasedStateMachine):
    """The model: the live blocks and their seeds."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, int]] = {}
        self.seed = 0

    @initialize(adapted=st.booleans())
    def build(self, adapted: bool) -> None:
        self.pool = spilling_pool()
        self.mr: Any = mr.StatisticsResourceAdaptor(self.pool) if adapted else self.pool

    @rule(size=st.integers(1, 3 * PAGE))
    def allocate(self, size: int) -> None:
        try:
            ptr = self.mr.allocate(size)
        except MemoryError:
            assert self.pool.mapped_bytes() + size > (DEVICE_PAGES + SPILL_PAGES) * PAGE - 3 * PAGE
            return
        self.seed += 1
        write(ptr, pattern(size, self.seed))
        self.live[ptr] = (size, self.seed)

    @rule(pick=st.integers(0, 1 << 16))
    def free(self, pick: int) -> None:
        if not self.live:
            return
        ptr = sorted(self.live)[pick % len(self.live)]
        size, _ = self.live.pop(ptr)
        self.mr.deallocate(ptr, size)

    @rule(limit=st.none() | st.integers(1, 4 * PAGE))
    def promote(self, limit: int | None) -> None:
        before = self.pool.spilled_bytes()
        report = self.mr.promote(max_bytes=limit)
        assert report["spilled"] == self.pool.spilled_bytes()
        assert report["promoted"] <= before
        if limit is not None:
            assert report["promoted"] <= -(-limit // PAGE) * PAGE
        elif report["spilled"]:
            device = self.pool.mapped_bytes() - report["spilled"]
            assert device == DEVICE_PAGES * PAGE, "pages left spilled with the device not full"

    @rule(pick=st.integers(0, 1 << 16))
    def promote_one_buffer(self, pick: int) -> None:
        if not self.live:
            return
        ptr = sorted(self.live)[pick % len(self.live)]
        report = self.mr.promote(ptr)
        assert report["spilled"] == self.pool.spilled_bytes()

    @rule()
    def trim(self) -> None:
        self.pool.trim()

    @rule(when=st.sampled_from(["safe_points", "frees", "off"]))
    def set_auto_promote(self, when: str) -> None:
        self.pool.auto_promote = when
        assert self.pool.auto_promote == when

    @rule()
    def at_rest(self) -> None:
        before = self.pool.spilled_bytes()
        report = rrmm.at_rest(self.mr)
        assert report["promoted"] <= before
        if self.pool.auto_promote == "off":
            assert report["promoted"] == 0 and self.pool.spilled_bytes() == before
        elif self.pool.spilled_bytes():
            device = self.pool.mapped_bytes() - self.pool.spilled_bytes()
            assert device == DEVICE_PAGES * PAGE, "a safe point left pages spilled with room"

    @rule()
    def sleep_and_wake(self) -> None:
        spilled = self.pool.spilled_bytes()
        did = self.mr.offload()
        # Spilled pages are host memory already: they stay mapped where they are, uncopied.
        assert self.pool.mapped_bytes() == spilled == self.pool.spilled_bytes()
        assert did["released_bytes"] >= did["copied_bytes"]
        self.mr.restore()

    @invariant()
    def bytes_kept_and_figures_agree(self) -> None:
        if not hasattr(self, "pool"):
            return
        for ptr, (size, seed) in self.live.items():
            assert np.array_equal(read(ptr, size), pattern(size, seed)), hex(ptr)
        figures = self.pool.spill_figures()
        assert figures is not None
        spilled = self.pool.spilled_bytes()
        assert figures["spilled"] == spilled
        assert figures["spilled"] + figures["kept"] <= figures["limit"]
        assert self.pool.mapped_bytes() - spilled <= DEVICE_PAGES * PAGE
        assert figures["made_ahead"] <= figures["made"]


TestSpillMachine = SpillMachine.TestCase
TestSpillMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_the_figures_of_a_spill_and_a_promotion() -> None:
    pool = spilling_pool()
    ptrs = [pool.allocate(PAGE) for _ in range(DEVICE_PAGES + 2)]
    assert pool.spilled_bytes() == 2 * PAGE
    assert pool.spill_figures() == {
        "limit": SPILL_PAGES * PAGE,
        "spilled": 2 * PAGE,
        "kept": PAGE,  # past the mark, half of what spilled is kept ready, made ahead
        "made": 3 * PAGE,
        "made_ahead": PAGE,
        "reused": 0,
        "promoted": 0,
        "promote_make_s": 0.0,
        "promote_copy_s": 0.0,
        "promote_remap_s": 0.0,
        "promote_reused": 0,
    }
    for p in ptrs[:2]:
        pool.deallocate(p, PAGE)
    report = pool.promote()
    assert (report["promoted"], report["spilled"]) == (2 * PAGE, 0)
    assert report["seconds"] >= report["trim_s"] >= 0
    assert pool.spill_figures()["kept"] == 3 * PAGE
    assert pool.give_back_spill() == 3 * PAGE
    for p in ptrs[2:]:
        pool.deallocate(p, PAGE)


def test_a_buffer_of_a_spilled_pool_promotes_through_any_adaptor() -> None:
    pool = spilling_pool()
    top = mr.LoggingResourceAdaptor(mr.StatisticsResourceAdaptor(pool), log_file_name="/dev/null")
    bufs = [rrmm.DeviceBuffer(size=PAGE, mr=top) for _ in range(DEVICE_PAGES + 1)]
    del bufs[0]
    last = bufs[-1]
    report = top.promote(last)
    assert report["promoted"] == PAGE
    assert pool.spilled_bytes() == 0


def test_promotion_without_spill_is_an_empty_report() -> None:
    pool = mr.ExpandableMemoryResource(
        reserve_size=64 * PAGE, page_size=PAGE, pageable_host=True
    )
    p = pool.allocate(PAGE)
    assert pool.spill_figures() is None
    empty = {"promoted": 0, "spilled": 0, "trimmed": 0, "seconds": 0.0, "trim_s": 0.0}
    assert pool.promote() == empty
    # A pool that never spills refuses to make spill pages (issue 50: it returned 0).
    with pytest.raises(RuntimeError, match=r"prepare_spill\(.*\): this pool never spills .* "
                       r"spill_to_host"):
        pool.prepare_spill(PAGE)
    pool.deallocate(p, PAGE)
    sim = mr.SimulatedMemoryResource(1 << 30)
    assert sim.promote()["promoted"] == 0


def test_bad_spill_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="device_capacity"):
        mr.ExpandableMemoryResource(reserve_size=64 * PAGE, page_size=PAGE, device_capacity=PAGE)
    with pytest.raises(ValueError, match="spill_to_host"):
        mr.ExpandableMemoryResource(simulated_capacity=1 << 30, spill_to_host=1 << 30)
    with pytest.raises((ValueError, TypeError)):
        spilling_pool(initial_pool_size=None).promote(max_bytes="lots")
    pool = spilling_pool()
    with pytest.raises(ValueError, match="threads"):
        pool.prepare_spill(PAGE, threads=0)
    with pytest.raises((ValueError, TypeError)):
        pool.promote(object())
    # The pool still works.
    p = pool.allocate(PAGE)
    pool.deallocate(p, PAGE)


def test_the_spill_limit_is_a_memory_error_that_leaves_the_pool_working() -> None:
    pool = mr.ExpandableMemoryResource(
        reserve_size=64 * PAGE,
        page_size=PAGE,
        pageable_host=True,
        device_capacity=2 * PAGE,
        spill_to_host=PAGE,
    )
    a = pool.allocate(3 * PAGE)
    with pytest.raises(MemoryError, match="limit"):
        pool.allocate(PAGE)
    pool.deallocate(a, 3 * PAGE)
    b = pool.allocate(PAGE)
    pool.deallocate(b, PAGE)


def test_prefetch_of_a_spilled_buffer_promotes_its_pages() -> None:
    pool = spilling_pool()
    bufs = [rrmm.DeviceBuffer(size=PAGE, mr=pool) for _ in range(DEVICE_PAGES + 2)]
    data = pattern(PAGE, 7)
    bufs[-1].copy_from_host(data)
    del bufs[:3]
    assert pool.spilled_bytes() == 2 * PAGE
    bufs[-1].prefetch()
    assert pool.spilled_bytes() == PAGE, "its page, not the other spilled one"
    assert bytes(bufs[-1].copy_to_host()) == data.tobytes()
    report = pool.promote(bufs[0])
    assert report["promoted"] == 0 and report["spilled"] == PAGE, "not spilled: nothing moves"


def test_reinitialize_spill_to_host_needs_the_expandable_pool() -> None:
    with pytest.raises(ValueError, match="spill_to_host"):
        rrmm.reinitialize(pool_allocator=True, spill_to_host=1 << 30)
    with pytest.raises(ValueError):
        rrmm.reinitialize(pool_allocator="expandable", spill_to_host="lots")
    with pytest.raises(TypeError):
        rrmm.reinitialize(pool_allocator="expandable", spill_to_host=1.5)  # type: ignore[arg-type]
    assert rrmm.host_pages.room() > 0


def test_a_snapshot_says_what_spilled_and_the_page_shows_it() -> None:
    from rrmm._snapshot_view import normalize, render_html

    pool = spilling_pool()
    mr.set_per_device_resource(0, pool)
    try:
        ptrs = [pool.allocate(PAGE) for _ in range(DEVICE_PAGES + 2)]
        snapshot = rrmm.memory_snapshot(0)
        spill = snapshot["rrmm"]["spill"]
        assert spill is not None and spill["spilled"] == 2 * PAGE and spill["limit"] == SPILL_PAGES * PAGE
        page = render_html(normalize(snapshot))
        assert "spilled to host" in page
        for p in ptrs:
            pool.deallocate(p, PAGE)
    finally:
        _rrmm._clear_per_device_resources()
    with pytest.raises(ValueError, match="rrmm.spill"):
        normalize({"segments": [], "rrmm": {"spill": {"spilled": -1}}})


def test_a_sleep_and_a_promotion_refused_for_host_room_change_nothing() -> None:
    """Issue 46, "a refused move that moved": with no room on the host, a spilling pool's sleep
    (whose device pages need host memory) and a promotion are refused, and every byte, page and
    figure is as it was; with room again, the sleep copies only the device pages (spilled pages
    are host memory already) and a promotion moves them back."""
    pool = spilling_pool()
    ptrs = [pool.allocate(PAGE) for _ in range(DEVICE_PAGES + 3)]
    for i, p in enumerate(ptrs):
        write(p, pattern(PAGE, i))
    spilled = pool.spilled_bytes()
    assert spilled == 3 * PAGE
    rrmm.host_pages.give_back()
    _rrmm._host_pages_set_room_cap(0)
    try:
        with pytest.raises(MemoryError, match="host"):
            pool.offload()
        assert not pool.asleep and pool.spilled_bytes() == spilled
        for p in ptrs[:3]:
            pool.deallocate(p, PAGE)  # room on the device: the promotion needs host room here
        with pytest.raises(MemoryError, match="nothing was moved"):
            pool.promote()
        assert pool.spilled_bytes() == spilled
    finally:
        _rrmm._host_pages_set_room_cap(None)
    for i, p in enumerate(ptrs[3:], start=3):
        assert np.array_equal(read(p, PAGE), pattern(PAGE, i)), i
    did = pool.offload()
    assert did["copied_bytes"] == (DEVICE_PAGES - 3) * PAGE, did
    assert pool.mapped_bytes() == spilled
    pool.restore()  # the user's wake is a safe point: the spilled pages move back there
    assert pool.spilled_bytes() == 0
    assert pool.spill_figures()["promoted"] == spilled
    for i, p in enumerate(ptrs[3:], start=3):
        assert np.array_equal(read(p, PAGE), pattern(PAGE, i)), i
        pool.deallocate(p, PAGE)



def test_any_size_is_one_word_for_reinitialize_replay_and_dask() -> None:
    """The one setup for data that may not fit: a stack kind every entry point takes by name."""
    from rrmm._stack import kinds

    assert "any_size" in kinds()
    pytest.importorskip("distributed")
    from rrmm.dask import RRMMSetup

    plugin = RRMMSetup(allocator="any_size", simulate="1GiB")
    assert plugin.stack_options()[0] == "any_size"


def test_a_dask_task_boundary_moves_spilled_data_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whenever no task runs on the worker, the plugin declares a safe point: spilled data
    moves back where the device has room; not while a task still runs."""
    pytest.importorskip("distributed")
    import rrmm.dask as rdask

    pool = spilling_pool()
    blocks = [pool.allocate(PAGE) for _ in range(DEVICE_PAGES + 2)]
    for i, ptr in enumerate(blocks):
        write(ptr, pattern(PAGE, i + 1))
    for ptr in blocks[:2]:
        pool.deallocate(ptr, PAGE)
    assert pool.spilled_bytes() == 2 * PAGE
    monkeypatch.setattr(rdask._state, "resource", pool)
    plugin = rdask.RRMMSetup(allocator="any_size", simulate="1GiB")
    plugin.transition("a", "ready", "executing", stimulus_id="s")
    plugin.transition("b", "ready", "executing", stimulus_id="s")
    plugin.transition("a", "executing", "memory", stimulus_id="s")
    assert pool.spilled_bytes() == 2 * PAGE, "b still runs: no safe point"
    plugin.transition("b", "executing", "memory", stimulus_id="s")
    assert pool.spilled_bytes() == 0, "no task runs: moved back"
    for i, ptr in enumerate(blocks[2:], start=2):
        assert np.array_equal(read(ptr, PAGE), pattern(PAGE, i + 1))
        pool.deallocate(ptr, PAGE)
