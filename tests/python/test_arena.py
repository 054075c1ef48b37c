"""rrmm.mr.ArenaMemoryResource on CPU (simulated memory): RMM's signature, round trips,
exhaustion as MemoryError with RMM's message, bogus frees, several threads."""

from __future__ import annotations

import json

import pytest
import rrmm
from conftest import run_threads
from rrmm import mr
from rrmm.pylibrmm.stream import DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM

MIB = 1 << 20


def test_exported_like_rmm(sim_mr):
    assert "ArenaMemoryResource" in mr.__all__
    assert issubclass(mr.ArenaMemoryResource, mr.UpstreamResourceAdaptor)
    assert rrmm.pylibrmm.memory_resource.ArenaMemoryResource is mr.ArenaMemoryResource


def test_signature_and_upstream(sim_mr):
    a = mr.ArenaMemoryResource(sim_mr, arena_size="8MiB")
    assert a.upstream_mr is sim_mr
    assert a.get_upstream() is sim_mr
    assert a.arena_size() == 8 * MIB
    b = mr.ArenaMemoryResource(upstream=sim_mr, arena_size=4 * MIB, dump_log_on_failure=False)
    assert b.get_upstream() is sim_mr
    default = mr.ArenaMemoryResource(sim_mr)
    assert default.arena_size() == 512 * MIB - 8 * MIB // 2 - 4 * MIB // 2
    with pytest.raises(TypeError):
        mr.ArenaMemoryResource()
    with pytest.raises(TypeError):
        mr.ArenaMemoryResource(sim_mr, upstream=sim_mr)
    with pytest.raises(TypeError):
        mr.ArenaMemoryResource(None)
    with pytest.raises(RuntimeError, match="smaller than minimum superblock size"):
        mr.ArenaMemoryResource(sim_mr, arena_size=4096)


def test_round_trips_on_streams(sim_mr):
    a = mr.ArenaMemoryResource(sim_mr, arena_size=16 * MIB)
    ptrs = []
    for i, stream in enumerate([DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM] * 8):
        n = 1000 * (i + 1)
        p = a.allocate(n, stream)
        assert p % 256 == 0 and p != 0
        ptrs.append((p, n, stream))
    big = a.allocate(3 * MIB)
    assert len({p for p, _, _ in ptrs} | {big}) == 17
    for p, n, stream in ptrs:
        a.deallocate(p, n, stream)
    a.deallocate(big, 3 * MIB)
    assert a.free_bytes() == 16 * MIB
    a.defragment()
    assert "Global arena:" in a.state_report()


def test_exhaustion_raises_memory_error_and_the_arena_works_afterwards(sim_mr):
    a = mr.ArenaMemoryResource(sim_mr, arena_size=4 * MIB)
    p = a.allocate(3 * MIB)
    with pytest.raises(MemoryError, match=r"No room in arena\."):
        a.allocate(2 * MIB)
    a.deallocate(p, 3 * MIB)
    q = a.allocate(4 * MIB)
    a.deallocate(q, 4 * MIB)
    assert a.free_bytes() == 4 * MIB


def test_dump_log_on_failure_writes_the_state(sim_mr, tmp_path, monkeypatch):
    path = tmp_path / "arena.log"
    monkeypatch.setenv("RMM_ARENA_DUMP", str(path))
    a = mr.ArenaMemoryResource(sim_mr, arena_size=2 * MIB, dump_log_on_failure=True)
    with pytest.raises(MemoryError):
        a.allocate(3 * MIB)
    text = path.read_text()
    assert f"Ran out of memory trying to allocate {3 * MIB} bytes." in text
    assert "Free range 0:" in text


def test_bogus_and_double_frees_raise_and_leave_the_arena_working(sim_mr):
    a = mr.ArenaMemoryResource(sim_mr, arena_size=8 * MIB)
    p = a.allocate(1000)
    with pytest.raises(RuntimeError, match="allocation not found"):
        a.deallocate(p + 256, 256)
    with pytest.raises(RuntimeError):
        a.deallocate(p, 5000)
    a.deallocate(p, 1000)
    with pytest.raises(RuntimeError, match="allocation not found"):
        a.deallocate(p, 1000)
    assert a.free_bytes() == 8 * MIB


def test_device_buffer_over_arena_over_system_memory():
    a = mr.ArenaMemoryResource(mr.SystemMemoryResource(), arena_size="2MiB")
    b = rrmm.DeviceBuffer.to_device(b"arena bytes", mr=a)
    assert b.tobytes() == b"arena bytes"
    del b
    assert a.free_bytes() == 2 * MIB


def test_several_threads_share_one_arena(sim_mr):
    a = mr.ArenaMemoryResource(sim_mr, arena_size=64 * MIB)
    seen: list[set[int]] = []

    def work(t: int) -> None:
        live = []
        mine = set()
        for i in range(400):
            if len(live) < 16 and (i % 3 or not live):
                n = 256 + (i * 7919 + t * 104729) % (256 << 10)
                p = a.allocate(n, PER_THREAD_DEFAULT_STREAM)
                assert p % 256 == 0
                live.append((p, n))
                mine.add(p)
            else:
                p, n = live.pop(i % len(live))
                a.deallocate(p, n, PER_THREAD_DEFAULT_STREAM)
        for p, n in live:
            a.deallocate(p, n, PER_THREAD_DEFAULT_STREAM)
        seen.append(mine)

    run_threads(8, work)
    assert len(seen) == 8
    assert a.free_bytes() == 64 * MIB
    # Each thread had its own arena: no address was handed to two threads.
    for i in range(8):
        for j in range(i + 1, 8):
            assert not (seen[i] & seen[j])


def test_replay_with_the_arena(capsys, tmp_path):
    from rrmm.__main__ import main

    log = tmp_path / "arena.csv"
    log.write_text(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,10:00:00.000001,allocate,0x7f0000000000,1000,0\n"
        "1,10:00:00.000002,allocate,0x7f0000100000,3145728,0x1000\n"
        "1,10:00:00.000003,free,0x7f0000000000,1000,0\n"
        "1,10:00:00.000004,free,0x7f0000100000,3145728,0x1000\n"
    )

    def replay_arena(arena_size: str) -> int:
        return main(
            ["replay", str(log), "--simulate", "1GiB", "--resource", "arena", "--arena-size", arena_size, "--json"]
        )

    code = replay_arena("8MiB")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"arena"' in out
    code = replay_arena("2MiB")
    out, err = capsys.readouterr()
    report = json.loads(out)["reports"][0]
    assert (report["failed_allocations"], report["failed_bytes"]) == (1, 3 * MIB)
    code = main(["replay", str(log), "--simulate", "1GiB", "--compare", "all"])
    out, err = capsys.readouterr()
    assert code == 0, err
    # The table's arena row (events are in the header now), with no failed allocation.
    assert "4 events" in out.splitlines()[0]
    header = out.splitlines()[1]
    failed_end = header.index("failed") + len("failed")  # the figures are right-aligned
    assert any(line.split()[:1] == ["arena"] and line[:failed_end].split()[-1] == "0"
               for line in out.splitlines()), out
