"""A generative test of the Python API (issue 18): a Hypothesis state machine builds random
resource graphs from every ``rrmm.mr`` class that works without a GPU, allocates, frees (right,
wrong size, twice, null, foreign), copies, pickles, resizes, reinitializes, from one thread and
several, with callbacks that misbehave, and checks a model after every step:

- live blocks handed out over one memory (one simulated device or the system's memory) never
  overlap, and are 256-byte aligned;
- every correct free is accepted; every bad one is refused with RMM's type (RuntimeError) and
  changes nothing (the block stays live and frees correctly later);
- the counters of statistics, tracking and limiting adaptors equal the model's, where the model
  can know them (allocations that reach the adaptor only through adaptors);
- allocations fail only with MemoryError (or, below a misbehaving callback, with that
  callback's own exception as RMM raises it), and a resource still works after any refusal;
- nothing crashes or hangs (a hang ends the run with every thread's stack after
  ``RRMM_MACHINE_HANG_S`` seconds);
- issue 29: the figures of every pool, expandable pool, fixed-size and arena resource agree with
  each other and with its snapshot after every step (free bytes, largest free block, free block
  count, fragmentation, segments and counts), and a pool's books keep every chunk it holds from a
  callback upstream, also when the upstream's free raises during ``release()`` (a
  ``CallbackMemoryResource`` whose free fails on command); the stack kinds that build without a
  GPU (pinned, pinned_pool, pinned_expandable, managed_pool, fallback, ... over simulated memory),
  managed simulated memory (``host_memory=``), host buffers and the current host resource, and
  memory history recording with snapshots are driven too.

Budgets: the ``ci`` profile (default) runs a bounded number of examples; ``RRMM_HYPOTHESIS=long``
runs many more (a long run outside CI: see the note in this file's history).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import rrmm
from conftest import run_threads
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
)
from rrmm import _stack, mr

KiB, MiB = 1 << 10, 1 << 20

settings.register_profile(
    "machine-ci",
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "machine-long",
    # RRMM_HYPOTHESIS_EXAMPLES bounds a long run to fit the time at hand.
    max_examples=int(os.environ.get("RRMM_HYPOTHESIS_EXAMPLES", "20000")),
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
PROFILE = "machine-" + os.environ.get("RRMM_HYPOTHESIS", "ci")

# Adaptors whose allocations reach their upstream unchanged (size and pointer).
PASS_THROUGH = {"statistics", "tracking", "limiting", "failure_callback", "prefetch", "logging"}
# Adaptors whose own counters the model checks.
COUNTED = {"statistics", "tracking", "limiting"}


# The stack kinds of rrmm._stack that build over simulated memory (without a GPU).
STACK_KINDS = {"pool", "expandable", "binning", "fixed_size", "managed_pool", "fallback",
               "pinned", "pinned_pool", "pinned_expandable", "simulated"}

#: Every resource class of rrmm.mr and rrmm.mr.experimental the machine builds (directly or
#: through a stack kind), and why the others are left to the GPU suites (checked by
#: test_resource_coverage.py).
MACHINE_CLASSES = {
    "SimulatedMemoryResource", "SystemMemoryResource", "StatisticsResourceAdaptor",
    "TrackingResourceAdaptor", "LimitingResourceAdaptor", "FailureCallbackResourceAdaptor",
    "PrefetchResourceAdaptor", "LoggingResourceAdaptor", "FallbackResourceAdaptor",
    "AlignedResourceAdaptor", "PoolMemoryResource", "FixedSizeMemoryResource",
    "BinningMemoryResource", "ArenaMemoryResource", "ExpandableMemoryResource",
    "CallbackMemoryResource", "SamHeadroomMemoryResource", "TieredMemoryResource",
    "TaggedMemoryResource",
}
MACHINE_GPU_ONLY = {
    "CudaMemoryResource": "cuMemAlloc needs a GPU",
    "PeerMemoryResource": "memory of a peer GPU needs two GPUs with a peer link "
                          "(test_peer_tier.py; the tiers run on simulated devices)",
    "ManagedMemoryResource": "the managed cache needs a GPU (its model runs on simulated "
                             "managed memory: SimulatedMemoryResource(host_memory=))",
    "PinnedHostMemoryResource": "cuMemHostAlloc needs a GPU (the pinned stack kinds run on "
                                "simulated memory)",
    "CudaAsyncMemoryResource": "cuMemAllocAsync needs a GPU",
    "CudaAsyncViewMemoryResource": "a view of a driver pool needs a GPU",
    "CudaAsyncManagedMemoryResource": "cuMemAllocAsync on a managed pool needs a GPU",
}


#: Bugs in the Rust figures the model found, each with a minimal reproducer (the tests in
#: test_figures_known_bugs.py run them). All three are fixed; an entry in ``KNOWN_FIGURE_BUGS``
#: makes the machine record a violation instead of failing (for a bug found but not yet fixed).
FIXED_FIGURE_BUGS = {
    "expandable-segment-counters": (
        "e = mr.ExpandableMemoryResource(simulated_capacity=8 << 20); e.allocate(256); "
        "s = _rrmm._memory_stats(e); assert s['segment.all.allocated'] - "
        "s['segment.all.freed'] == s['segment.all.current']  # was: allocated 0, current 1"
    ),
    "pool-fully-free-split": (
        "p = mr.PoolMemoryResource(mr.SimulatedMemoryResource(16 << 30), "
        "initial_pool_size=1 << 30); p.deallocate(p.allocate(4_000_000), 4_000_000); "
        "assert p.free_block_count() == 1 and p.largest_free_block() == p.free_bytes()"
        "  # was: 2 free blocks, largest 1069741824 of 1073741824"
    ),
    "pool-release-forgets-chunks": (
        "sim = mr.SimulatedMemoryResource(1 << 30); fail = []\n"
        "def free(p, n, s):\n"
        "    if fail: raise KeyError('upstream free failed')\n"
        "    sim.deallocate(p, n, s)\n"
        "cb = mr.CallbackMemoryResource(lambda n, s: sim.allocate(n, s), free)\n"
        "pool = mr.PoolMemoryResource(cb, 1 << 20)\n"
        "pool.deallocate(pool.allocate(4 << 20), 4 << 20); fail.append(1)\n"
        "try:\n    pool.release()\nexcept RuntimeError:\n    pass\n"
        "assert pool.pool_size() == sim.bytes_in_use()  # 0 against 5242880: chunks dropped"
    ),
}
KNOWN_FIGURE_BUGS: dict[str, str] = {}
SEEN_KNOWN_BUGS: set[str] = set()


def _expect(ok: bool, bug: str | None, what: Any) -> None:
    """Asserts ``ok``; a violation of a known bug (``KNOWN_FIGURE_BUGS``) is recorded instead."""
    if ok:
        return
    if bug is not None and bug in KNOWN_FIGURE_BUGS:
        SEEN_KNOWN_BUGS.add(bug)
        return
    raise AssertionError(what)


def _coalesces(obj: Any) -> bool:
    """Whether the suballocator whose segments ``obj`` reports (through adaptors) coalesces free
    neighbours: the pool and the expandable pool do; fixed-size blocks, bins and caches do not."""
    for _ in range(300):
        name = type(obj).__name__
        if not name.endswith("ResourceAdaptor") or not hasattr(obj, "upstream_mr"):
            return name in ("PoolMemoryResource", "ExpandableMemoryResource")
        obj = obj.upstream_mr
    return False


def _check_figures(obj: Any) -> None:
    """The figures a resource reports agree with each other and with its snapshot."""
    has = lambda name: callable(getattr(obj, name, None))
    free = obj.free_bytes() if has("free_bytes") else None
    if has("largest_free_block") and free is not None:
        largest = obj.largest_free_block()
        count = obj.free_block_count()
        assert 0 <= largest <= free, (largest, free)
        assert (count == 0) == (free == 0), (count, free)
        assert count == 0 or largest * count >= free, (largest, count, free)
        fragmentation = 1 - largest / free if free else 0.0
        assert 0.0 <= fragmentation < 1.0
    segments = rrmm._rrmm._memory_snapshot(obj, 0)
    stats = rrmm._rrmm._memory_stats(obj)
    if segments is None:
        return
    total = 0
    inactive: list[int] = []
    active: list[int] = []
    for seg in segments:
        end = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == end, f"blocks do not tile their segment: {seg}"
            end += b["size"]
            (active if b["state"] == "active_allocated" else inactive).append(b["size"])
        assert end - seg["address"] == seg["total_size"], seg
        total += seg["total_size"]
        if _coalesces(obj) and all(b["state"] != "active_allocated" for b in seg["blocks"]):
            # A segment with nothing allocated is one free block (freed neighbours coalesce).
            _expect(len(seg["blocks"]) == 1, "pool-fully-free-split",
                    f"a segment with nothing allocated has {len(seg['blocks'])} free blocks: {seg}")
    stats_asleep = stats is not None and stats.get("offloaded_bytes.all.current", 0) > 0
    if has("pool_size") and type(obj).__name__ in ("PoolMemoryResource",
                                                   "ExpandableMemoryResource"):
        # A sleeping expandable pool maps nothing; its offloaded segments keep their addresses.
        mapped = stats_asleep and type(obj).__name__ == "ExpandableMemoryResource"
        assert obj.pool_size() == (0 if mapped else total), (total, obj.pool_size())
    if free is not None and has("largest_free_block"):
        assert sum(inactive) == free, (sum(inactive), free)
        assert max(inactive, default=0) == obj.largest_free_block()
        assert len(inactive) == obj.free_block_count()
    asleep = stats_asleep
    if stats is not None and asleep:
        # Asleep (the pool, or a pool below it): nothing mapped, what it holds is offloaded,
        # and every segment says so.
        assert stats["reserved_bytes.all.current"] == 0, stats
        assert stats["offloaded_bytes.all.current"] == total, (stats, total)
        assert all(seg.get("offloaded") for seg in segments), segments
    elif stats is not None:
        assert stats["offloaded_bytes.all.current"] == 0, stats
        assert not any(seg.get("offloaded") for seg in segments), segments
        assert stats["reserved_bytes.all.current"] == total, (stats, total)
        assert stats["allocated_bytes.all.current"] == sum(active), (stats, sum(active))
        assert stats["allocation.all.current"] == len(active), (stats, len(active))
        assert stats["segment.all.current"] == len(segments), (stats, len(segments))
        for key in ("allocation", "segment", "allocated_bytes", "reserved_bytes"):
            cur, peak = stats[f"{key}.all.current"], stats[f"{key}.all.peak"]
            done, freed = stats[f"{key}.all.allocated"], stats[f"{key}.all.freed"]
            assert cur <= peak, (key, stats)
            # The expandable pool's signature (also read through adaptors over it): segments
            # current but none ever counted allocated or freed.
            bug = ("expandable-segment-counters"
                   if key == "segment" and done == 0 and freed == 0 else None)
            if not (asleep and key == "reserved_bytes"):
                _expect(done - freed == cur, bug, (key, stats))


@dataclass(eq=False)
class Node:
    """One resource of the graph, with what the model knows of it."""

    obj: Any
    kind: str
    root: int  # the memory its blocks come from (one simulated device or the system's memory)
    upstream: Node | None = None
    misbehaves: bool = False  # a callback that may raise or return garbage
    host: bool = False  # hands out host memory rrmm knows as such (copies work without a GPU)
    # The model's counters (for COUNTED kinds): bytes and count of allocations through it.
    bytes: int = 0
    count: int = 0
    total_bytes: int = 0
    total_count: int = 0
    peak_bytes: int = 0
    peak_count: int = 0
    limit_bytes: int = 0  # limiting: allocations rounded up to 256
    modeled: bool = True  # False once anything but a pass-through adaptor sits over it
    totals_known: bool = True  # False once buffers or threads allocated through it
    extra: dict[str, Any] = field(default_factory=dict)

    def chain(self) -> list[Node]:
        """This node and the pass-through adaptors' upstreams below it (where an allocation
        at this node is seen with its own size and pointer)."""
        out = [self]
        node = self
        while node.kind in PASS_THROUGH and node.upstream is not None:
            node = node.upstream
            out.append(node)
        return out


@dataclass(eq=False)
class Block:
    node: Node
    ptr: int
    size: int


def _aligned_up(n: int) -> int:
    return (n + 255) // 256 * 256


class ApiMachine(RuleBasedStateMachine):
    nodes = Bundle("nodes")
    blocks = Bundle("blocks")

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Any] = []
        self.all_nodes: list[Node] = []
        self.live: list[Block] = []
        self.freed: list[Block] = []
        self.tmpdir = os.environ.get("TMPDIR", "/tmp")
        self.host = np.arange(4096, dtype=np.uint8)  # a foreign (host) address, never handed out
        self.recording = False
        rrmm.record_memory_history(None)
        # Unpickled buffers go to the current device's resource (host memory without a GPU).
        if rrmm._rrmm.device_count() == 0:
            mr.set_current_device_resource(mr.SystemMemoryResource())

    # ------------------------------------------------------------------ building the graph

    def _root(self, obj: Any, kind: str) -> Node:
        self.roots.append(obj)
        node = Node(obj, kind, len(self.roots) - 1)
        self.all_nodes.append(node)
        return node

    @rule(target=nodes, size=st.sampled_from([4 * MiB, 64 * MiB, 1 << 30]))
    def simulated(self, size: int) -> Node:
        return self._root(mr.SimulatedMemoryResource(size), "simulated")

    @rule(target=nodes, size=st.sampled_from([4 * MiB, 64 * MiB]),
          host=st.sampled_from([1 * MiB, 64 * MiB]))
    def managed_simulated(self, size: int, host: int) -> Node:
        """Simulated managed memory: allocations beyond the device succeed, up to ``host``
        more bytes, and are counted as beyond the device."""
        node = self._root(mr.SimulatedMemoryResource(size, host_memory=host), "simulated")
        node.extra["managed"] = (size, host)
        return node

    @rule(target=nodes, kind=st.sampled_from(sorted(STACK_KINDS)),
          size=st.sampled_from([64 * MiB, 1 << 30]),
          initial=st.sampled_from([None, 2 * MiB]))
    def stack(self, kind: str, size: int, initial: int | None) -> Node:
        """A stack kind of ``rrmm._stack`` over simulated memory (the pinned kinds among them:
        they build without a GPU where the memory is simulated)."""
        options = {} if initial is None or kind in ("simulated", "pinned") else {
            "initial_pool_size": initial}
        try:
            obj = _stack.build(kind, simulate=size, **options)
        except MemoryError:
            return multiple()  # type: ignore[return-value]
        node = self._root(obj, f"stack:{kind}")
        node.modeled = False
        return node

    @rule(target=nodes)
    def system(self) -> Node:
        node = self._root(mr.SystemMemoryResource(), "system")
        node.host = True
        return node

    def _over(self, up: Node, obj: Any, kind: str) -> Node:
        node = Node(obj, kind, up.root, upstream=up, host=up.host and kind != "callback")
        if kind not in PASS_THROUGH:
            for below in up.chain():
                below.modeled = False
        self.all_nodes.append(node)
        return node

    def _unmodel(self, up: Node) -> None:
        """Something that is not a pass-through adaptor is being built over ``up``: its
        chunks (even those of a construction that fails) reach the adaptors below."""
        up.extra["constructions"] = up.extra.get("constructions", 0) + 1
        for below in up.chain():
            below.modeled = False

    def _totals_unknown(self, node: Node) -> None:
        for n in node.chain():
            n.totals_known = False

    @rule(target=nodes, up=nodes, kind=st.sampled_from(sorted(PASS_THROUGH)),
          limit=st.sampled_from([0, 4 * KiB, 1 * MiB, 1 << 40]))
    def adaptor(self, up: Node, kind: str, limit: int) -> Node:
        if kind == "statistics":
            obj = mr.StatisticsResourceAdaptor(up.obj)
        elif kind == "tracking":
            obj = mr.TrackingResourceAdaptor(up.obj)
        elif kind == "limiting":
            obj = mr.LimitingResourceAdaptor(up.obj, limit)
        elif kind == "failure_callback":
            calls = {"n": 0}

            def callback(nbytes: int) -> bool:
                calls["n"] += 1
                return calls["n"] % 3 == 1  # retry once in a while, then give up

            obj = mr.FailureCallbackResourceAdaptor(up.obj, callback)
        elif kind == "prefetch":
            obj = mr.PrefetchResourceAdaptor(up.obj)
        else:
            path = os.path.join(self.tmpdir, f"rrmm-machine-{os.getpid()}-{id(up)}.csv")
            obj = mr.LoggingResourceAdaptor(up.obj, path)
        node = self._over(up, obj, kind)
        node.extra["limit"] = limit
        return node

    @rule(target=nodes, up=nodes)
    def fallback(self, up: Node) -> Node:
        """Falls back to the memory the node's chain starts from (so every block, wherever it
        came from, lies in one root's memory and the overlap checks stay exact)."""
        obj = mr.FallbackResourceAdaptor(up.obj, self.roots[up.root])
        node = self._over(up, obj, "fallback")
        node.host = up.host
        return node

    @rule(target=nodes, up=nodes)
    def tagged(self, up: Node) -> Node:
        """Allocation by tag over an expandable node: its first tag is the node's pool (where
        allocations go: no tag is made current), a second tag a pool of its own that sleeps and
        wakes (its memory is no node's)."""
        if not isinstance(up.obj, mr.ExpandableMemoryResource):
            return multiple()  # type: ignore[return-value]
        obj = mr.TaggedMemoryResource(up.obj, "first")
        other = mr.ExpandableMemoryResource(simulated_capacity=8 * MiB)
        obj.add_tag("second", other)
        other.deallocate(other.allocate(MiB), MiB)
        other.offload()
        other.restore()
        node = self._over(up, obj, "tagged")
        node.host = up.host
        return node

    @rule(target=nodes, up=nodes)
    def tiered(self, up: Node) -> Node:
        """Tiers after the node: the memory its chain starts from (as the fallback's alternate,
        so the overlap checks stay exact)."""
        obj = mr.TieredMemoryResource(up.obj, [self.roots[up.root]], names=["peer"])
        node = self._over(up, obj, "tiered")
        node.host = up.host
        return node

    @rule(node=nodes)
    def tier_counts_add_up(self, node: Node) -> None:
        if node.kind != "tiered":
            return
        counts = node.obj.tier_counts()
        assert [c["name"] for c in counts] == ["device", "peer"]
        for c in counts:
            assert c["peak_bytes"] >= c["current_bytes"] >= 0
            assert c["total_allocations"] >= c["current_allocations"] >= 0
        assert node.obj.tiers[1] is self.roots[node.root]

    @rule(node=nodes)
    def fallback_counts_add_up(self, node: Node) -> None:
        if node.kind != "fallback":
            return
        c = node.obj.counts()
        assert c["alternate_peak_bytes"] >= c["alternate_bytes"] >= 0
        assert c["fallbacks"] >= c["alternate_allocations"] >= 0
        assert node.obj.alternate_mr is self.roots[node.root]

    @rule(target=nodes, up=nodes, alignment=st.sampled_from([256, 512, 4096]),
          threshold=st.sampled_from([0, 256, 64 * KiB]))
    def aligned(self, up: Node, alignment: int, threshold: int) -> Node:
        node = self._over(up, mr.AlignedResourceAdaptor(up.obj, alignment, threshold), "aligned")
        node.extra["alignment"] = (alignment, threshold)
        return node

    @rule(target=nodes, up=nodes, initial=st.sampled_from([0, 256 * KiB, 2 * MiB]),
          maximum=st.sampled_from([None, 2 * MiB, 32 * MiB]))
    def pool(self, up: Node, initial: int, maximum: int | None) -> Node:
        self._unmodel(up)
        try:
            obj = mr.PoolMemoryResource(up.obj, initial, maximum)
        except self._allowed(up):
            return multiple()  # type: ignore[return-value]
        return self._over(up, obj, "pool")

    @rule(target=nodes, up=nodes, block=st.sampled_from([256, 4 * KiB, 1 * MiB]),
          blocks=st.integers(1, 16))
    def fixed_size(self, up: Node, block: int, blocks: int) -> Node:
        self._unmodel(up)
        try:
            obj = mr.FixedSizeMemoryResource(up.obj, block, blocks)
        except self._allowed(up):
            return multiple()  # type: ignore[return-value]
        node = self._over(up, obj, "fixed_size")
        node.extra["block"] = block
        return node

    @rule(target=nodes, up=nodes, low=st.integers(8, 14), width=st.integers(-1, 4))
    def binning(self, up: Node, low: int, width: int) -> Node:
        self._unmodel(up)
        try:
            obj = mr.BinningMemoryResource(up.obj, low, low + width)
        except self._allowed(up):
            return multiple()  # type: ignore[return-value]
        return self._over(up, obj, "binning")

    @rule(binning=nodes, size=st.sampled_from([300, 512, 3000, 16 * KiB, 300 * KiB]),
          bin_node=st.one_of(st.none(), nodes))
    def add_bin(self, binning: Node, size: int, bin_node: Node | None) -> None:
        if binning.kind != "binning":
            return
        if bin_node is None:
            try:
                binning.obj.add_bin(size)
            except self._allowed(binning):
                pass
            return
        reaches = self._reaches(bin_node, binning, through_callbacks=False)
        if bin_node.root != binning.root and not reaches:
            return  # keep one memory per graph, so overlaps stay checkable
        try:
            binning.obj.add_bin(size, bin_node.obj)
        except ValueError as e:
            assert reaches, f"refused a bin that does not reach the binning resource: {e}"
            return
        assert not reaches, "accepted a bin that reaches the binning resource (a cycle)"
        for below in bin_node.chain():
            below.modeled = False
        binning.extra.setdefault("bins", []).append(bin_node)

    def _reaches(self, node: Node, target: Node, through_callbacks: bool = True) -> bool:
        """Whether ``node`` is ``target`` or reaches it; a callback's function is opaque to rrmm
        (its calls into other resources are bounded at run time instead), so with
        ``through_callbacks=False`` the walk stops at callbacks."""
        todo, seen = [node], set()
        while todo:
            n = todo.pop()
            if n is target:
                return True
            if id(n) in seen:
                continue
            seen.add(id(n))
            if n.kind == "callback" and not through_callbacks:
                continue
            if n.upstream is not None:
                todo.append(n.upstream)
            todo.extend(n.extra.get("targets", []))
        return False

    @rule(target=nodes, up=nodes, size=st.sampled_from([2 * MiB, 16 * MiB]))
    def arena(self, up: Node, size: int) -> Node:
        self._unmodel(up)
        try:
            obj = mr.ArenaMemoryResource(up.obj, size)
        except (MemoryError, RuntimeError):  # too small for a superblock, or no room
            return multiple()  # type: ignore[return-value]
        return self._over(up, obj, "arena")

    @rule(target=nodes, capacity=st.sampled_from([8 * MiB, 256 * MiB]),
          maximum=st.sampled_from([None, 4 * MiB, 64 * MiB]))
    def expandable(self, capacity: int, maximum: int | None) -> Node:
        obj = mr.ExpandableMemoryResource(simulated_capacity=capacity, maximum_pool_size=maximum)
        return self._root(obj, "expandable")

    @rule(target=nodes, up=nodes,
          behaviour=st.sampled_from(["forward", "raise", "null", "misaligned", "reenter",
                                     "free_fails_on_command"]))
    def callback(self, up: Node, behaviour: str) -> Node:
        """A callback resource forwarding to ``up``, or misbehaving in one way
        (``free_fails_on_command``: its free raises while ``fail_frees`` says so)."""
        holder: dict[str, Any] = {"live": {}, "fail": False}
        target = up.obj

        def allocate(nbytes: int, stream: Any) -> int:
            ptr = _allocate(nbytes, stream)
            if ptr and ptr % 256 == 0:  # what `up` handed out (not a misbehaving answer)
                holder["live"][ptr] = nbytes
            return ptr

        def deallocate(ptr: int, nbytes: int, stream: Any) -> None:
            if ptr == 0:
                return  # a null free frees nothing (RMM passes it to the function)
            if holder["fail"]:
                raise KeyError("the upstream's free failed (on command)")
            target.deallocate(ptr, nbytes, stream)
            holder["live"].pop(ptr, None)

        def _allocate(nbytes: int, stream: Any) -> int:
            if behaviour == "raise" and nbytes > 4 * KiB:
                raise KeyError("callback failed")
            if behaviour == "null" and nbytes > 4 * KiB:
                return 0
            if behaviour == "misaligned" and nbytes > 4 * KiB:
                return 0x1001
            if behaviour == "reenter" and "above" in holder:
                try:
                    p = holder["above"].allocate(256)
                    holder["above"].deallocate(p, 256)
                except (RuntimeError, MemoryError):
                    pass
            return int(target.allocate(nbytes, stream))

        node = self._over(up, mr.CallbackMemoryResource(allocate, deallocate), "callback")
        node.misbehaves = behaviour != "forward"
        node.extra["fails_on_command"] = behaviour == "free_fails_on_command"
        node.extra["targets"] = [up]
        node.extra["holder"] = holder
        return node

    @rule(callback=nodes, on=st.booleans())
    def fail_frees(self, callback: Node, on: bool) -> None:
        """Commands a callback's free to raise (or to work again)."""
        if callback.extra.get("fails_on_command"):
            callback.extra["holder"]["fail"] = on

    @rule(node=nodes, fill=st.sampled_from(["undefined", "zero"]))
    def sleep_and_wake(self, node: Node, fill: str) -> None:
        """Sleep and wake through any node (issue 36). A stack over an expandable pool offloads
        every pool below it, says so at every level of its figures (nothing reserved, all of it
        offloaded, every segment marked) while asleep, refuses allocations that would reach a
        sleeping pool (with RuntimeError naming the sleep), and wakes with every live block where
        it was; a stack over none refuses by name and changes nothing."""
        try:
            estimate = node.obj.sleep_estimate()
        except RuntimeError as e:
            assert "sleep needs" in str(e), e
            with pytest.raises(RuntimeError, match="sleep needs"):
                node.obj.offload()
            assert not node.obj.asleep
            return
        did = node.obj.offload(discard_fill=fill)
        try:
            assert node.obj.asleep
            assert did == estimate, (did, estimate)
            for n in node.chain():
                _check_figures(n.obj)
            try:
                ptr = node.obj.allocate(256)
            except RuntimeError as e:
                assert "asleep" in str(e) or self._misbehaves(node), e
            except MemoryError as e:
                # A limiting adaptor on the way checks its limit before its upstream is asked
                # (RMM's order): past the limit it refuses as out of memory, asleep or not.
                assert any(
                    n.kind == "limiting" and n.limit_bytes + _aligned_up(256) > n.extra["limit"]
                    for n in node.chain()
                ) or self._misbehaves(node), e
            else:
                # A path that reaches no sleeping pool (a fallback's other side) still serves.
                node.obj.deallocate(ptr, 256)
        finally:
            node.obj.restore()
        assert not node.obj.asleep
        for n in node.chain():
            _check_figures(n.obj)

    @rule(node=nodes, limit=st.none() | st.integers(0, 1 << 30))
    def promote_through_any_node(self, node: Node, limit: int | None) -> None:
        """``promote()`` through any node (issue 37): none of these pools spills (simulated
        memory, no ``spill_to_host``), so it moves nothing, synchronizes nothing, says so, and
        leaves every figure as it was; ``spill_figures()`` is None at every level."""
        try:
            report = node.obj.promote(max_bytes=limit)
        except RuntimeError as e:
            # A pool below asleep refuses by name (another rule may leave none asleep: restore
            # runs in its finally).
            assert "asleep" in str(e), e
            return
        assert report == {"promoted": 0, "spilled": 0, "trimmed": 0, "seconds": 0.0,
                          "trim_s": 0.0}, report
        assert node.obj.spill_figures() is None
        for n in node.chain():
            _check_figures(n.obj)

    @rule(node=nodes)
    def release_or_trim(self, node: Node) -> None:
        """``release()`` / ``trim()`` of any resource that has one, also while an upstream's
        free fails: a failure is the upstream's exception (as RMM raises it) and the books keep
        every chunk the upstream still holds (checked by ``pool_books_match_the_upstream``)."""
        method = getattr(node.obj, "release", None) or getattr(node.obj, "trim", None)
        if method is None or not callable(method):
            return
        try:
            method()
        except RuntimeError:
            if not self._misbehaves(node):
                raise

    @rule(callback=nodes, above=nodes)
    def let_callback_reenter(self, callback: Node, above: Node) -> None:
        """A re-entering callback calls into a resource above it (a pool over it, say)."""
        if callback.kind == "callback" and "holder" in callback.extra:
            callback.extra["holder"]["above"] = above.obj

    # ------------------------------------------------------------------ allocating and freeing

    def _misbehaves(self, node: Node) -> bool:
        """Whether a call at ``node`` may meet a misbehaving callback, or a callback that calls
        back into a resource on its own path (bounded, then refused)."""
        todo, seen = [node], set()
        while todo:
            n = todo.pop()
            if n.misbehaves:
                return True
            if id(n) in seen:
                continue
            seen.add(id(n))
            below = ([n.upstream] if n.upstream is not None else []) + n.extra.get(
                "targets", []) + n.extra.get("bins", [])
            for b in below:
                if b is node:
                    return True  # a cycle (through a callback)
                todo.append(b)
        return False

    def _allowed(self, node: Node) -> tuple[type[BaseException], ...]:
        return (MemoryError, RuntimeError) if self._misbehaves(node) else (MemoryError,)

    def _count(self, node: Node, size: int, sign: int) -> None:
        for n in node.chain():
            if n.kind in COUNTED:
                if size == 0 and n.kind == "statistics":
                    # A zero-byte allocation is the null pointer, and freeing it is a null free
                    # of 0 bytes: the adaptor counts one while one is outstanding, so whichever
                    # null free of 0 bytes comes first ends it (see free_null).
                    zeros = n.extra.get("zeros", 0)
                    if sign < 0 and zeros == 0:
                        continue
                    n.extra["zeros"] = zeros + sign
                n.bytes += sign * size
                n.count += sign
                n.limit_bytes += sign * _aligned_up(size)
                if sign > 0:
                    n.total_bytes += size
                    n.total_count += 1
                    n.peak_bytes = max(n.peak_bytes, n.bytes)
                    n.peak_count = max(n.peak_count, n.count)

    @rule(target=blocks, node=nodes,
          size=st.one_of(st.sampled_from([0, 1, 255, 256, 257, 4096, 1 * MiB, 3 * MiB]),
                         st.integers(1, 2 * MiB)))
    def allocate(self, node: Node, size: int) -> Block:
        try:
            ptr = node.obj.allocate(size)
        except self._allowed(node):
            return multiple()  # type: ignore[return-value]
        assert ptr % 256 == 0, f"{node.kind} handed out {ptr:#x}, not 256-byte aligned"
        if size == 0:
            assert ptr == 0, f"{node.kind}: a zero-byte allocation is the null pointer"
        block = Block(node, ptr, size)
        self._count(node, size, +1)
        if size:
            for other in self.live:
                if other.node.root == node.root and other.size and other.ptr < ptr + size and ptr < other.ptr + other.size:
                    raise AssertionError(f"overlap: {node.kind} {ptr:#x}+{size} and "
                                         f"{other.node.kind} {other.ptr:#x}+{other.size}")
        self.live.append(block)
        return block

    @rule(block=consumes(blocks))
    def free(self, block: Block) -> None:
        if block not in self.live:
            return
        try:
            block.node.obj.deallocate(block.ptr, block.size)
        except RuntimeError:
            if self._misbehaves(block.node):
                return  # a callback below may refuse its own frees; the block stays the node's
            raise
        self.live.remove(block)
        self.freed.append(block)
        self._count(block.node, block.size, -1)

    @rule(block=blocks)
    def free_with_a_wrong_size(self, block: Block) -> None:
        if block not in self.live or block.size == 0:
            return
        wrong = 2 * block.size + 2 * MiB + 256
        with pytest.raises(RuntimeError):
            block.node.obj.deallocate(block.ptr, wrong)

    @rule(block=blocks)
    def free_twice(self, block: Block) -> None:
        if block in self.live or block.size == 0:
            return
        # Only where nothing live sits at that address in that memory (else it is a free of the
        # new block, which no resource can tell from a right one).
        if any(b.node.root == block.node.root and b.ptr <= block.ptr < b.ptr + max(b.size, 1)
               for b in self.live):
            return
        with pytest.raises(RuntimeError):
            block.node.obj.deallocate(block.ptr, block.size)

    @rule(node=nodes, size=st.sampled_from([0, 1, 1000]))
    def free_null(self, node: Node, size: int) -> None:
        node.obj.deallocate(0, size)
        # Nothing is freed; but a null free of 0 bytes is also how a zero-byte allocation ends,
        # so a statistics adaptor with one outstanding counts it ended.
        if size == 0:
            self._count(node, 0, -1)

    @rule(node=nodes, foreign=st.sampled_from(["bogus", "host"]))
    def free_foreign(self, node: Node, foreign: str) -> None:
        ptr = 0x1000 if foreign == "bogus" else int(self.host.ctypes.data) // 256 * 256 + 256
        with pytest.raises(RuntimeError):
            node.obj.deallocate(ptr, 256)

    # ------------------------------------------------------------------ buffers and copies

    @rule(node=nodes, data=st.binary(min_size=0, max_size=3000))
    def buffer_round_trip(self, node: Node, data: bytes) -> None:
        """DeviceBuffer over any node: system memory copies; simulated memory refuses to."""
        self._totals_unknown(node)
        try:
            buf = rrmm.DeviceBuffer(size=len(data), mr=node.obj)
        except self._allowed(node):
            return
        if not data:
            assert buf.tobytes() == b""
            return
        on_simulated = not isinstance(self.roots[node.root], mr.SystemMemoryResource)
        if on_simulated or (not node.host and rrmm._rrmm.device_count() == 0):
            # Simulated memory has nothing behind it (with or without a GPU); without a driver a
            # callback's memory is device memory that cannot be reached.
            with pytest.raises(RuntimeError, match="simulated|no CUDA driver"):
                buf.copy_from_host(np.frombuffer(data, dtype=np.uint8))
            return
        buf.copy_from_host(np.frombuffer(data, dtype=np.uint8))
        assert buf.tobytes() == data
        again = pickle.loads(pickle.dumps(buf, protocol=5))
        assert again.tobytes() == data
        try:
            buf.resize(len(data) * 2 + 1)
            buf.reserve(len(data) * 4 + 8)
        except self._allowed(node):
            return
        assert buf.tobytes()[: len(data)] == data
        buf.resize(len(data) // 2)
        assert buf.tobytes() == data[: len(data) // 2]

    @rule(node=nodes)
    def copy_from_a_pageable_host_address(self, node: Node) -> None:
        """RMM's DeviceBuffer(ptr=<host address>) copies pageable host memory."""
        if not node.host:
            return
        self._totals_unknown(node)
        try:
            buf = rrmm.DeviceBuffer(ptr=self.host.ctypes.data, size=self.host.nbytes, mr=node.obj)
        except self._allowed(node):
            return
        assert buf.tobytes() == self.host.tobytes()

    # ------------------------------------------------------------------ host memory, history

    @rule(node=st.one_of(st.none(), nodes))
    def set_host_resource(self, node: Node | None) -> None:
        """The current host resource takes host kinds and refuses the others (issue 29)."""
        if node is None:
            mr.set_current_host_resource(None)
            return
        if node.obj._rrmm_kind in ("host", "pinned_host"):
            mr.set_current_host_resource(node.obj)
            assert mr.get_current_host_resource() is node.obj
            self._totals_unknown(node)
            return
        before = mr.get_current_host_resource()
        with pytest.raises(ValueError, match="host"):
            mr.set_current_host_resource(node.obj)
        assert mr.get_current_host_resource() is before

    @rule(node=st.one_of(st.none(), nodes), data=st.binary(min_size=0, max_size=2000))
    def host_buffer_round_trip(self, node: Node | None, data: bytes) -> None:
        """A HostBuffer from a node (or the current host resource) holds what is written."""
        target = mr.get_current_host_resource() if node is None else node.obj
        if target._rrmm_kind not in ("host", "pinned_host"):
            with pytest.raises(ValueError, match="host"):
                rrmm.HostBuffer(len(data), mr=target)
            return
        if node is not None:
            self._totals_unknown(node)
        else:
            for n in self.all_nodes:
                if n.obj is target:
                    self._totals_unknown(n)
        allowed = self._allowed(node) if node is not None else (MemoryError,)
        try:
            hb = rrmm.HostBuffer(len(data), mr=target)
        except allowed:
            return
        assert hb.size == len(data)
        if data:
            hb.view()[:] = data
            assert hb.tobytes() == data
            dev = rrmm.DeviceBuffer(size=len(data), mr=mr.SystemMemoryResource())
            hb.copy_to_device(dev)
            hb.synchronize()
            assert dev.tobytes() == data

    @rule(on=st.booleans(), stacks=st.sampled_from([None, "python"]))
    def record_history(self, on: bool, stacks: str | None) -> None:
        rrmm.record_memory_history("all" if on else None, max_entries=64, stacks=stacks)
        self.recording = on

    @rule(node=nodes, size=st.integers(1, 64 * KiB))
    def history_sees_buffers(self, node: Node, size: int) -> None:
        """A DeviceBuffer made while recording shows in the snapshot's trace."""
        self._totals_unknown(node)
        try:
            buf = rrmm.DeviceBuffer(size=size, mr=node.obj)
        except self._allowed(node):
            return
        trace = rrmm.memory_snapshot(0)["device_traces"][0]
        seen = any(e["action"] == "alloc" and e["addr"] == buf.ptr and e["size"] == size
                   for e in trace)
        assert seen == self.recording, (self.recording, trace[-3:])
        ptr = buf.ptr
        del buf
        trace = rrmm.memory_snapshot(0)["device_traces"][0]
        if self.recording:
            assert any(e["action"] == "free_completed" and e["addr"] == ptr for e in trace)

    # ------------------------------------------------------------------ threads, reinitialize

    @rule(node=nodes, threads=st.integers(2, 4))
    def threads_allocate_and_free(self, node: Node, threads: int) -> None:
        self._totals_unknown(node)

        def work(t: int) -> None:
            for i in range(20):
                size = 256 * (1 + (t * 7 + i) % 9)
                try:
                    p = node.obj.allocate(size)
                except self._allowed(node):
                    continue
                node.obj.deallocate(p, size)

        try:
            run_threads(threads, work)
        except BaseException:
            if not self._misbehaves(node):
                raise

    @rule(devices=st.sampled_from([0, [0], [5], [-1], ["x"]]))
    def reinitialize(self, devices: Any) -> None:
        """Without a GPU reinitialize warns and sets nothing; bad ordinals are refused first."""
        if rrmm._rrmm.device_count() > 0:
            return
        bad = devices in ([-1], ["x"])
        if bad:
            with pytest.raises((ValueError, TypeError)):
                rrmm.reinitialize(devices=devices)
            return
        with pytest.warns(RuntimeWarning):
            rrmm.reinitialize(devices=devices)
        mr.set_current_device_resource(mr.SystemMemoryResource())  # for unpickled buffers

    # ------------------------------------------------------------------ the model

    @invariant()
    def counters_equal_the_model(self) -> None:
        for n in self.all_nodes:
            self._check_counters(n)

    def _check_counters(self, n: Node) -> None:
        if not n.modeled or n.kind not in COUNTED:
            return
        if n.kind == "statistics":
            c = n.obj.allocation_counts
            assert (c.current_bytes, c.current_count) == (n.bytes, n.count), (c, n.bytes, n.count)
            if n.totals_known:
                assert (c.total_bytes, c.total_count) == (n.total_bytes, n.total_count), c
                assert (c.peak_bytes, c.peak_count) == (n.peak_bytes, n.peak_count), c
        elif n.kind == "tracking":
            assert n.obj.get_allocated_bytes() == n.bytes
        elif n.kind == "limiting":
            assert n.obj.get_allocated_bytes() == n.limit_bytes

    @invariant()
    def figures_agree(self) -> None:
        for n in self.all_nodes:
            _check_figures(n.obj)
            managed = n.extra.get("managed")
            if managed is not None:
                size, host = managed
                now, peak = n.obj.beyond_device_bytes()
                assert 0 <= now <= peak <= host, (now, peak, host)
                assert n.obj.bytes_in_use() - now <= size, (n.obj.bytes_in_use(), now, size)
            if n.kind == "fallback":
                c = n.obj.counts()
                assert c["alternate_peak_bytes"] >= c["alternate_bytes"] >= 0, c

    @invariant()
    def pool_books_match_the_upstream(self) -> None:
        """A pool directly over a callback holds exactly what the callback handed it and has
        not taken back (a failed release must not drop chunks from the pool's books)."""
        for n in self.all_nodes:
            up = n.upstream
            if n.kind != "pool" or up is None or up.kind != "callback":
                continue
            if (up.extra["holder"].get("above") is not None or self._shared_upstream(up, n)
                    or up.misbehaves and not up.extra.get("fails_on_command")
                    or up.extra.get("constructions", 0) != 1):
                continue
            held = sum(up.extra["holder"]["live"].values())
            _expect(n.obj.pool_size() == held, "pool-release-forgets-chunks"
                    if n.obj.pool_size() < held else None, (n.obj.pool_size(), held))

    def _shared_upstream(self, up: Node, node: Node) -> bool:
        """Whether anything but ``node`` allocates from ``up`` (then its books are not only
        the pool's)."""
        return any(m is not node and (m.upstream is up or up in m.extra.get("bins", []))
                   for m in self.all_nodes) or any(b.node is up for b in self.live)

    @invariant()
    def every_resource_still_works(self) -> None:
        for block in list(self.live)[-3:]:
            node = block.node
            try:
                p = node.obj.allocate(256)
            except self._allowed(node):
                continue
            self._count(node, 256, +1)
            try:
                node.obj.deallocate(p, 256)
            except RuntimeError:
                if not self._misbehaves(node):
                    raise
                # A free that failed below (on command): the block stays the node's.
                self.live.append(Block(node, p, 256))
                continue
            self._count(node, 256, -1)

    def teardown(self) -> None:
        rrmm.record_memory_history(None)
        mr.set_current_host_resource(None)
        for n in self.all_nodes:
            if n.extra.get("fails_on_command"):
                n.extra["holder"]["fail"] = False
        # Every live block frees correctly at the end, whatever happened before.
        for block in list(self.live):
            try:
                block.node.obj.deallocate(block.ptr, block.size)
            except RuntimeError:
                if not self._misbehaves(block.node):
                    raise


@pytest.fixture(autouse=True)
def _no_hang() -> Any:
    """A hang ends the run with every thread's stack instead of blocking CI."""
    # The whole run is one test: a long run gets a budget to match.
    default = "600" if PROFILE == "machine-ci" else "14400"
    faulthandler.dump_traceback_later(float(os.environ.get("RRMM_MACHINE_HANG_S", default)),
                                      exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


TestApi = ApiMachine.TestCase
TestApi.settings = settings.get_profile(PROFILE)
