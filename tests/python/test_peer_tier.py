"""The peer tier (issue 32): ``TieredMemoryResource`` (device -> peer GPU -> host, counts per
tier) on simulated devices standing for the GPUs, the ``tiered`` stack kind, its replay and
snapshot figures; ``PeerMemoryResource`` on two GPUs with a peer link (skipped otherwise)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rrmm import _rrmm, _stack, mr
from rrmm._snapshot_view import render_html

MiB = 1 << 20
PAGE = 2 * MiB


def _charge(n: int) -> int:
    """What a simulated device charges for ``n`` bytes: whole 2 MiB pages from a page, 256 B
    units below."""
    unit = PAGE if n >= PAGE else 256
    return -(-n // unit) * unit


def _three(device: int, peer: int, host: int) -> tuple[list[Any], Any]:
    sims = [mr.SimulatedMemoryResource(size) for size in (device, peer, host)]
    return sims, mr.TieredMemoryResource(sims[0], sims[1:], names=["peer", "host"])


def test_allocations_fill_the_tiers_in_order_and_frees_go_back_to_their_tier() -> None:
    sims, tiered = _three(8 * MiB, 4 * MiB, 16 * MiB)
    assert tiered.tier_names == ["device", "peer", "host"]
    assert tiered.tiers == sims and tiered.upstream_mr is sims[0]
    a = tiered.allocate(6 * MiB)
    b = tiered.allocate(4 * MiB)  # the device is full: the peer GPU
    c = tiered.allocate(4 * MiB)  # both full: host memory
    assert [tiered.tier_of(p) for p in (a, b, c)] == ["device", "peer", "host"]
    assert [s.bytes_in_use() for s in sims] == [6 * MiB, 4 * MiB, 4 * MiB]
    counts = tiered.tier_counts()
    assert [(t["name"], t["current_bytes"], t["refused"]) for t in counts] == [
        ("device", 6 * MiB, 2), ("peer", 4 * MiB, 1), ("host", 4 * MiB, 0)]
    with pytest.raises(RuntimeError, match="tiered"):
        tiered.deallocate(b, MiB)  # the wrong size: refused, nothing changes
    for ptr, size in ((a, 6 * MiB), (b, 4 * MiB), (c, 4 * MiB)):
        tiered.deallocate(ptr, size)
    with pytest.raises(RuntimeError, match="not allocated"):
        tiered.deallocate(a, 6 * MiB)
    assert [s.bytes_in_use() for s in sims] == [0, 0, 0]
    assert [t["peak_bytes"] for t in tiered.tier_counts()] == [6 * MiB, 4 * MiB, 4 * MiB]
    with pytest.raises(MemoryError, match="every tier is out of memory"):
        tiered.allocate(1 << 40)
    assert tiered.failures() == 1
    tiered.reset_peaks()
    assert all(t["peak_bytes"] == 0 for t in tiered.tier_counts())


def test_arguments_are_checked_and_default_names_follow_the_memory() -> None:
    device = mr.SimulatedMemoryResource("8MiB")
    with pytest.raises(TypeError, match="tiers"):
        mr.TieredMemoryResource(device)
    with pytest.raises(TypeError, match="sequence"):
        mr.TieredMemoryResource(device, device)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DeviceMemoryResource"):
        mr.TieredMemoryResource(device, ["host"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="names"):
        mr.TieredMemoryResource(device, [device], names=["a", "b"])
    with pytest.raises(ValueError, match="two tiers"):
        mr.TieredMemoryResource(device, [device], names=["device"])
    assert mr.TieredMemoryResource(device, [mr.SystemMemoryResource()]).tier_names == [
        "device", "host"]
    assert mr.TieredMemoryResource(device, [device]).tier_names == ["device", "tier1"]


@settings(max_examples=60, deadline=None)
@given(caps=st.lists(st.integers(0, 10), min_size=3, max_size=3),
       ops=st.lists(st.one_of(st.tuples(st.just("alloc"), st.one_of(
           st.integers(1, 8192), st.integers(MiB, 5 * MiB))),
           st.tuples(st.just("free"), st.integers(0, 1 << 16))), max_size=60))
def test_tiers_match_a_model(caps: list[int], ops: list[tuple[str, int]]) -> None:
    """Generated allocations and frees: each lands on the first tier with room (a full tier
    passes it to the next), each free goes back to its tier, and the counts match a model."""
    sims, tiered = _three(*(c * MiB for c in caps))
    sizes = [s.size for s in sims]
    used = [0, 0, 0]
    model = [{"current_bytes": 0, "peak_bytes": 0, "total_allocations": 0, "refused": 0}
             for _ in range(3)]
    live: list[tuple[int, int, int]] = []
    for op, n in ops:
        if op == "alloc":
            fits = next((i for i in range(3) if used[i] + _charge(n) <= sizes[i]), None)
            for m in model[:3 if fits is None else fits]:
                m["refused"] += 1
            if fits is None:
                with pytest.raises(MemoryError):
                    tiered.allocate(n)
                continue
            ptr = tiered.allocate(n)
            assert tiered.tier_of(ptr) == ["device", "peer", "host"][fits]
            used[fits] += _charge(n)
            m = model[fits]
            m["current_bytes"] += n
            m["peak_bytes"] = max(m["peak_bytes"], m["current_bytes"])
            m["total_allocations"] += 1
            live.append((ptr, n, fits))
        elif live:
            ptr, size, tier = live.pop(n % len(live))
            tiered.deallocate(ptr, size)
            used[tier] -= _charge(size)
            model[tier]["current_bytes"] -= size
        counts = tiered.tier_counts()
        for t in range(3):
            assert {k: counts[t][k] for k in model[t]} == model[t]
            assert sims[t].bytes_in_use() == used[t]
    for ptr, size, _ in live:
        tiered.deallocate(ptr, size)
    assert [s.bytes_in_use() for s in sims] == [0, 0, 0]


def test_the_tiered_kind_builds_device_peer_and_host_tiers() -> None:
    top = _stack.build("tiered", simulate=8 * MiB, initial_pool_size=8 * MiB,
                       maximum_pool_size=8 * MiB, peer_memory=8 * MiB, host_memory=64 * MiB)
    assert isinstance(top, mr.TieredMemoryResource)
    assert isinstance(top.upstream_mr, mr.PoolMemoryResource)
    peer, host = top.tiers[1:]
    assert peer.size == 8 * MiB and host.host_memory == 64 * MiB
    ptrs = [top.allocate(6 * MiB) for _ in range(3)]
    assert [top.tier_of(p) for p in ptrs] == ["device", "peer", "host"]
    for p in ptrs:
        top.deallocate(p, 6 * MiB)
    assert "tiered" in _stack.kinds()


def test_the_snapshot_carries_the_tier_of_each_segment_and_the_viewer_shows_it() -> None:
    top = _stack.build("tiered", simulate=8 * MiB, initial_pool_size=8 * MiB,
                       maximum_pool_size=8 * MiB, peer_memory=8 * MiB)
    a, b = top.allocate(6 * MiB), top.allocate(6 * MiB)
    try:
        segments = _rrmm._memory_snapshot(top, 0)
        assert segments is not None
        assert [s["tier"] for s in segments] == ["device", "peer"]
        assert segments[1]["address"] == b and segments[1]["allocated_size"] == 6 * MiB
        with pytest.raises(RuntimeError):
            top.sleep_estimate()  # a pool cannot sleep
        page = render_html({"segments": segments, "device_traces": [[]]})
        assert "tier peer" in page and "peer 6.00 MiB held" in page
    finally:
        top.deallocate(a, 6 * MiB)
        top.deallocate(b, 6 * MiB)
    # Other resources' snapshots keep PyTorch's keys alone.
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource("64MiB"), 4 * MiB)
    assert "tier" not in (_rrmm._memory_snapshot(pool, 0) or [{}])[0]


def test_the_snapshot_says_what_a_sleep_of_the_expandable_pool_would_free() -> None:
    pool = mr.ExpandableMemoryResource(simulated_capacity=64 * MiB)
    a = pool.allocate(3 * MiB)
    b = pool.allocate(5 * MiB)
    pool.deallocate(b, 5 * MiB)
    try:
        segments = _rrmm._memory_snapshot(pool, 0)
        assert segments is not None
        sleep = dict(pool.sleep_estimate())
        mapped = sum(s["total_size"] for s in segments)
        assert mapped == pool.mapped_bytes() == sleep["released_bytes"]
        assert sleep["copied_bytes"] == 3 * MiB and sleep["discarded_bytes"] == 0
        snapshot = {"segments": segments, "device_traces": [[]], "rrmm": {"sleep": sleep}}
        page = render_html(pickle.loads(pickle.dumps(snapshot)))
        assert "a sleep would free" in page and "3.00 MiB of live data" in page
        # A snapshot without the pool's figures (PyTorch's, an old file) has no such row.
        assert "a sleep would free" not in render_html({"segments": segments,
                                                        "device_traces": [[]]})
    finally:
        pool.deallocate(a, 3 * MiB)


def test_a_sleeping_pools_segments_are_marked_offloaded_in_the_snapshot_and_the_viewer() -> None:
    pool = mr.ExpandableMemoryResource(simulated_capacity=64 * MiB)
    a = pool.allocate(3 * MiB)
    assert not any(s.get("offloaded") for s in _rrmm._memory_snapshot(pool, 0))
    pool.offload()
    try:
        segments = _rrmm._memory_snapshot(pool, 0)
        assert segments and all(s["offloaded"] is True for s in segments)
        page = render_html({"segments": segments, "device_traces": [[]]})
        assert "offloaded (the pool sleeps" in page
    finally:
        pool.restore()
    assert not any(s.get("offloaded") for s in _rrmm._memory_snapshot(pool, 0))
    pool.deallocate(a, 3 * MiB)


def test_memory_snapshot_carries_the_sleep_figures_and_tiers_of_the_current_resource() -> None:
    import rrmm

    pool = mr.ExpandableMemoryResource(simulated_capacity=64 * MiB)
    mr.set_current_device_resource(pool)
    try:
        a = pool.allocate(3 * MiB)
        snap = rrmm.memory_snapshot()
        assert snap["rrmm"]["sleep"] == dict(pool.sleep_estimate())
        assert snap["rrmm"]["sleep"]["released_bytes"] == pool.mapped_bytes()
        assert snap["rrmm"]["sleep"]["copied_bytes"] == 3 * MiB
        pool.deallocate(a, 3 * MiB)
        top = _stack.build("tiered", simulate=8 * MiB, initial_pool_size=8 * MiB,
                           maximum_pool_size=8 * MiB)
        mr.set_current_device_resource(top)
        b, c = top.allocate(6 * MiB), top.allocate(6 * MiB)
        snap = rrmm.memory_snapshot()
        assert snap["rrmm"]["sleep"] is None
        assert [s["tier"] for s in snap["segments"]] == ["device", "peer"]
        top.deallocate(b, 6 * MiB)
        top.deallocate(c, 6 * MiB)
    finally:
        _rrmm._clear_per_device_resources()


def test_replay_over_tiers_reports_bytes_and_peaks_per_tier(tmp_path: Path) -> None:
    log = tmp_path / "tiers.csv"
    six = 6 * MiB
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   + "".join(f"1,t,allocate,{0x1000 * i:#x},{six},0\n" for i in (1, 2, 3))
                   + "".join(f"1,t,free,{0x1000 * i:#x},{six},0\n" for i in (1, 2, 3)))
    common = [sys.executable, "-m", "rrmm", "replay", str(log), "--simulate", "8MiB",
              "--peer-memory", "8MiB", "--host-memory", "64MiB", "--initial-pool-size",
              "8MiB", "--maximum-pool-size", "8MiB", "--repeat", "1", "-q"]
    out = subprocess.run(common + ["--compare", "tiered,expandable", "--json"],
                         capture_output=True, text=True, check=True).stdout
    rows = {r["resource"]: r for r in json.loads(out)["reports"]}
    tiers = rows["tiered"]["tiers"]
    assert [(t["name"], t["peak_bytes"]) for t in tiers] == [
        ("device", six), ("peer", six), ("host", six)]
    assert rows["tiered"]["failed_allocations"] == 0
    assert rows["expandable"]["tiers"] is None
    assert rows["expandable"]["sleep_releases_at_peak"] >= six
    text = subprocess.run(common + ["--resource", "tiered"], capture_output=True, text=True,
                          check=True).stdout
    assert "tiers: device peak 6.00 MiB" in text and "peer peak 6.00 MiB" in text
    # Part of --compare all on simulated memory, as --help says every resource is (issue 39).
    out = subprocess.run([sys.executable, "-m", "rrmm", "replay", str(log), "--simulate",
                          "1GiB", "--compare", "all", "--repeat", "1", "-q", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert "tiered" in {r["resource"] for r in json.loads(out)["reports"]}


# ------------------------------------------------------------------ peer GPUs


def _peer_skip_reason() -> str | None:
    count = _rrmm.device_count()
    if count == 0:
        return "no GPU: a peer GPU needs two GPUs with a peer link"
    if count < 2:
        return "one GPU: a peer GPU needs two GPUs with a peer link"
    return None


def test_without_a_peer_gpu_construction_says_why() -> None:
    count = _rrmm.device_count()
    with pytest.raises(RuntimeError, match="no CUDA driver|no peer link"):
        mr.PeerMemoryResource(max(count, 1))
    if count:
        with pytest.raises(ValueError, match="another device"):
            mr.PeerMemoryResource(0, device=0)


@pytest.mark.skipif(_peer_skip_reason() is not None, reason=_peer_skip_reason() or "")
def test_peer_memory_is_on_the_peer_and_the_device_reads_it() -> None:
    import numpy as np

    try:
        peer = mr.PeerMemoryResource(1, device=0)
    except RuntimeError as e:
        assert "no peer link" in str(e)
        pytest.skip(f"GPUs 0 and 1 have no peer link: {e}")
    assert (peer.peer, peer.device) == (1, 0)
    data = np.arange(64 * MiB // 8, dtype=np.uint64)
    on_peer = _rrmm.DeviceBuffer.to_device(data.view(np.uint8), mr=peer)
    # Device 0 copies from its peer's memory into its own (peer-to-peer), then to the host.
    local = _rrmm.DeviceBuffer(size=on_peer.size, mr=mr.CudaMemoryResource())
    local.copy_from_device(on_peer)
    back = np.frombuffer(local.tobytes(), dtype=np.uint64)
    assert (back == data).all()
    tiered = mr.TieredMemoryResource(mr.CudaMemoryResource(),
                                     [peer, mr.PinnedHostMemoryResource()])
    assert tiered.tier_names == ["device", "peer", "host"]
    del on_peer, local
