"""``rrmm replay --compare ...,torch,cupy`` without a GPU: the engine over allocators written in
Python (``_rrmm.replay_allocator``): a pure-Python test peer (``fake_peers.AddressAllocator``)
against rrmm's simulated kind, out of memory and other exceptions raised inside it, the GIL;
the adapters of ``rrmm._replay_peers`` against stand-ins for PyTorch's caching allocator and
CuPy's memory pool (``fake_peers``), on a hand-computed log; rrmm's resources driven from
Python on simulated memory against the engine's own rows; the messages when a framework is
missing, there is no GPU, or ``--simulate`` is given."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_peers import AddressAllocator, make_cupy, make_torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rrmm import _replay_peers, _rrmm
from rrmm.__main__ import main

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
MiB = 1 << 20
OTHER_STREAM = "0x55d0c2a1e0f0"

# 100 and 200 MiB on stream 0, both freed; 500 MiB (the peak in use, event 4) freed; 50 MiB on
# another stream never freed. Under the fakes' rules (blocks cached per stream, reused whole by
# the smallest request that fits): 800 MiB reserved at the peak with 100 + 200 MiB inactive
# (fragmentation 1 - 200/300), 850 MiB at the end with 100 + 200 + 500 inactive (1 - 500/800);
# with a limit it fits from exactly 500 MiB (the cache is emptied before failing).
PEER_LOG = f"""{HEADER}
1,10:00:00.000001,allocate,0x7f0000000000,{100 * MiB},0
1,10:00:00.000002,allocate,0x7f0010000000,{200 * MiB},0
1,10:00:00.000003,free,0x7f0000000000,{100 * MiB},0
1,10:00:00.000004,free,0x7f0010000000,{200 * MiB},0
1,10:00:00.000005,allocate,0x7f0020000000,{500 * MiB},0
1,10:00:00.000006,free,0x7f0020000000,{500 * MiB},0
2,10:00:00.000007,allocate,0x7f0040000000,{50 * MiB},{OTHER_STREAM}
"""
PEAK_EVENT = 4


@pytest.fixture
def peer_log(tmp_path: Path) -> str:
    path = tmp_path / "peers.csv"
    path.write_text(PEER_LOG)
    return str(path)


@pytest.fixture
def fakes(monkeypatch):
    """Fake torch and cupy (1 GiB devices) in sys.modules; returns (torch cache, cupy pools)."""
    torch, torch_cache = make_torch(1 << 30)
    cupy, cupy_pools = make_cupy(1 << 30)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return torch_cache, cupy_pools


@pytest.fixture
def allow_simulated_peers(monkeypatch):
    """Lets the command replay the fakes beside rrmm on simulated memory (real peers refuse)."""
    monkeypatch.setattr(_replay_peers, "peer_problem", lambda peers, simulate, gpu: None)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def replay_torch(path: str, total: int = 1 << 30, repeat: int | None = 2, timed: bool = True):
    torch, cache = make_torch(total)
    adapter = _replay_peers.torch_adapter(torch, gpu=False)
    try:
        return _replay_peers.replay(_rrmm.ReplayLog(path), adapter, repeat, timed), cache
    finally:
        adapter.close()


def replay_fake(path: str, a: AddressAllocator, repeat: int | None = None, **kwargs):
    """The engine's row of ``path`` replayed through the test peer ``a`` (the figures pass
    alone unless ``repeat`` is given)."""
    kwargs.setdefault("held_bytes", a.held_bytes)
    kwargs.setdefault("timed", repeat is not None)
    return _rrmm.replay_allocator(_rrmm.ReplayLog(path), "fake", a.allocate, a.deallocate,
                                  repeat=repeat, **kwargs)


# ------------------------------------------------------------------------------- the log


def test_the_log_parsed_once_has_the_engines_facts(peer_log):
    facts = _rrmm.ReplayLog(peer_log).facts
    engine = _rrmm.replay_logs([peer_log], ["pool"], simulate=4 << 30, timed=False)[0]
    for key in ("log", "events", "allocations", "streams", "threads", "log_peak_bytes",
                "log_unfreed_allocations", "log_largest_request", "null_rows", "driver"):
        assert facts[key] == engine[key], key
    assert facts["driver"] == "rust" and facts["ns_per_event"] is None
    assert (facts["events"], facts["streams"]) == (7, 2)


def test_log_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{HEADER}\n1,t,free,0x10,5,0\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: free of pointer 0x10"):
        _rrmm.ReplayLog(str(bad))
    assert _rrmm.ReplayLog(str(bad), lenient=True).facts["parse_warnings"] == 1
    with pytest.raises(OSError):
        _rrmm.ReplayLog(str(tmp_path / "missing.csv"))


# ------------------------------------------------------------------------------- the engine


def test_a_python_allocator_row_has_the_engines_shape(peer_log):
    a = AddressAllocator(1 << 30)
    row = replay_fake(peer_log, a, repeat=3, setup="a test peer")
    engine = _rrmm.replay_logs([peer_log], ["simulated"], simulate=1 << 30, repeat=3)[0]
    assert set(row) == set(engine), "the engine's record"
    assert (row["resource"], row["driver"], row["setup"], row["error"]) == (
        "fake", _replay_peers.PYTHON_DRIVER, "a test peer", None)
    assert row["repeats"] == 3 and len(row["samples_ns"]) == 3
    assert row["total_ns"] == sorted(row["samples_ns"])[1], "the median repetition"
    assert row["ns_per_event"] == pytest.approx(row["total_ns"] / row["events"])
    assert (row["peak_bytes_in_use"], row["peak_footprint"]) == (500 * MiB, 500 * MiB)
    assert (row["leaked_allocations"], row["leaked_bytes"]) == (1, 50 * MiB)
    assert row["internal_waste_at_peak"] is None and row["timeline"] is None
    assert row["fragmentation_at_peak"] is None, "no free_blocks: no fragmentation"
    # The figures pass and three repetitions, each freeing the leak: nothing live after.
    assert (a.allocations, a.frees, a.live) == (16, 16, {})
    assert a.streams == {0, 0x1001}, "the default stream and the engine's key for the other"


def test_footprint_and_fragmentation_come_from_the_functions(peer_log):
    a = AddressAllocator(1 << 30)
    row = replay_fake(peer_log, a, held_bytes=lambda: 7 * MiB, free_blocks=lambda: [1, 3])
    assert row["peak_footprint"] == row["footprint_at_end"] == 7 * MiB
    assert row["fragmentation_at_peak"] == row["fragmentation_at_end"] == pytest.approx(0.25)
    no_figures = replay_fake(peer_log, AddressAllocator(1 << 30), held_bytes=None)
    assert no_figures["peak_footprint"] is None and no_figures["overhead"] is None


class FakeOutOfMemory(RuntimeError):
    """An allocator's own out-of-memory error that is not a MemoryError (PyTorch's)."""


@pytest.mark.parametrize("how", ["MemoryError", "its own type", "a null pointer"])
def test_out_of_memory_in_python_is_a_failed_event(peer_log, how):
    """As a Rust kind's out of memory: counted at its event, its free skipped, the replay
    goes on (the 500 MiB allocation, event 4, does not fit in 400 MiB)."""
    if how == "MemoryError":
        a = AddressAllocator(400 * MiB)
        row = replay_fake(peer_log, a, repeat=1)
    elif how == "its own type":
        a = AddressAllocator(400 * MiB, oom=FakeOutOfMemory)
        row = replay_fake(peer_log, a, repeat=1, out_of_memory=(FakeOutOfMemory,))
    else:
        a = AddressAllocator(1 << 30)
        allocate = a.allocate
        row = _rrmm.replay_allocator(
            _rrmm.ReplayLog(peer_log), "fake",
            lambda size, stream: 0 if size == 500 * MiB else allocate(size, stream),
            a.deallocate, repeat=1)
    engine = _rrmm.replay_logs([peer_log], ["simulated"], simulate=400 * MiB, repeat=1)[0]
    assert row["error"] is None, row["error"]
    for key in ("failed_allocations", "failure_events", "failed_bytes", "peak_bytes_in_use",
                "leaked_allocations", "leaked_bytes"):
        assert row[key] == engine[key], key
    assert row["failure_events"] == [PEAK_EVENT] and a.live == {}


def test_another_exception_ends_the_replay_as_a_row_with_the_error(peer_log):
    """Not out of memory: the row says why (as a Rust kind's error), what is live is freed,
    and the next replay works (no GIL or lock left behind)."""
    a = AddressAllocator(1 << 30, oom=FakeOutOfMemory)  # not declared out of memory
    a.fail_on(2, ValueError("the allocator broke"))
    row = replay_fake(peer_log, a)
    assert row["error"] == "ValueError: the allocator broke"
    assert row["ns_per_event"] is None and row["failed_allocations"] is None
    assert a.live == {}, "what was live was given back"
    a = AddressAllocator(100 * MiB, oom=FakeOutOfMemory)
    row = replay_fake(peer_log, a)
    assert row["error"] is not None and "FakeOutOfMemory" in row["error"]
    assert replay_fake(peer_log, AddressAllocator(1 << 30))["error"] is None


def test_an_interrupt_is_raised_after_freeing(peer_log):
    a = AddressAllocator(1 << 30)
    a.fail_on(1, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        replay_fake(peer_log, a)
    assert a.live == {}


def test_errors_of_the_figures_functions_and_bad_addresses_are_rows(peer_log):
    def broken() -> int:
        raise ZeroDivisionError("no figure")

    row = replay_fake(peer_log, AddressAllocator(1 << 30), held_bytes=broken)
    assert row["error"] == "ZeroDivisionError: no figure"
    a = AddressAllocator(1 << 30)
    allocate = a.allocate
    row = _rrmm.replay_allocator(_rrmm.ReplayLog(peer_log), "fake",
                                 lambda size, stream: allocate(size, stream) + 8, a.deallocate)
    assert row["error"] is not None and "not 256-byte aligned" in row["error"]
    with pytest.raises(TypeError, match="callable"):
        _rrmm.replay_allocator(_rrmm.ReplayLog(peer_log), "fake", 1, a.deallocate)  # type: ignore[arg-type]
    row = replay_fake(peer_log, AddressAllocator(1 << 30), held_bytes=lambda: "many")
    assert row["error"] is not None and row["error"].startswith("TypeError")


def test_replays_run_without_holding_the_gil(peer_log, tmp_path):
    """The engine holds the GIL only inside each call of a Python function: another thread
    runs Python during a replay, and replays on two threads at once both finish."""
    path = tmp_path / "long.csv"
    lines = [HEADER]
    for i in range(2000):
        lines.append(f"1,t,allocate,{0x10000 + i * 0x1000:#x},4096,0")
        lines.append(f"1,t,free,{0x10000 + i * 0x1000:#x},4096,0")
    path.write_text("\n".join(lines) + "\n")
    seen: list[str] = []
    rows: dict[str, dict] = {}
    started = threading.Event()
    together = threading.Barrier(2, timeout=60)

    def run(name: str) -> None:
        a = AddressAllocator(1 << 30)
        allocate = a.allocate
        first = [True]

        def tracing(size: int, stream: int) -> int:
            if first[0]:
                first[0] = False
                started.set()
                together.wait()  # both replays are under way before either goes on
            seen.append(name)
            return allocate(size, stream)

        rows[name] = dict(_rrmm.replay_allocator(_rrmm.ReplayLog(str(path)), name, tracing,
                                                 a.deallocate, repeat=2))

    threads = [threading.Thread(target=run, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
    assert started.wait(60)
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a replay did not finish: the GIL or a lock was kept"
    assert rows["first"]["error"] is None and rows["second"]["error"] is None
    # Both made progress while the other was replaying: their calls interleave.
    switches = sum(1 for x, y in itertools.pairwise(seen) if x != y)
    assert switches >= 1 and len(seen) == 2 * 3 * 2000




# ------------------------------------------------------------------------------- the driver


def test_torch_figures_on_a_hand_computed_log(peer_log):
    r, cache = replay_torch(peer_log)
    assert (r["resource"], r["driver"], r["error"]) == ("torch", "python", None)
    assert r["peak_bytes_in_use"] == 500 * MiB
    assert r["peak_footprint"] == 850 * MiB
    assert r["overhead"] == pytest.approx(850 / 500)
    assert r["fragmentation_at_peak"] == pytest.approx(1 - 200 / 300)
    assert r["fragmentation_at_end"] == pytest.approx(1 - 500 / 800)
    assert r["footprint_at_end"] == 850 * MiB
    assert (r["failed_allocations"], r["failure_events"]) == (0, [])
    assert (r["leaked_allocations"], r["leaked_bytes"]) == (1, 50 * MiB)
    assert r["repeats"] == 2 and len(r["samples_ns"]) == 2 and r["ns_per_event"] > 0
    assert r["internal_waste_at_peak"] is None and r["timeline"] is None
    # The log's streams: its default stream is PyTorch's default stream (0), the other one a
    # stream of its own; every allocation is freed (leaks after each pass) and nothing more.
    streams = {size: stream for op, size, stream in cache.calls if op == "alloc"}
    assert streams[100 * MiB] == streams[500 * MiB] == 0 and streams[50 * MiB] != 0
    assert cache.active == {} and cache.requested_in_use == 0
    assert cache.reserved == 0, "the cache is emptied when the row is done"


def test_failures_are_counted_and_their_frees_skipped(peer_log):
    # 600 MiB: the 500 MiB allocation fits once the cache is emptied; 400 MiB: it fails.
    r, _ = replay_torch(peer_log, total=600 * MiB)
    assert (r["failed_allocations"], r["peak_footprint"]) == (0, 550 * MiB)
    assert r["fragmentation_at_peak"] == 0.0
    r, cache = replay_torch(peer_log, total=400 * MiB)
    assert r["failed_allocations"] == 1 and r["failure_events"] == [PEAK_EVENT]
    assert r["failed_bytes"] == 500 * MiB
    assert r["peak_bytes_in_use"] == 300 * MiB
    assert cache.failures == 3, "the figures pass and two repetitions"
    assert cache.active == {}, "the failed allocation's free was skipped, the rest freed"


def test_cupy_figures_streams_and_no_fragmentation(peer_log):
    cupy, pools = make_cupy(1 << 30)
    adapter = _replay_peers.cupy_adapter(cupy, gpu=False)
    r = _replay_peers.replay(_rrmm.ReplayLog(peer_log), adapter, repeat=3)
    adapter.close()
    (cache,) = pools
    assert (r["resource"], r["driver"], r["repeats"]) == ("cupy", "python", 3)
    assert (r["peak_bytes_in_use"], r["peak_footprint"]) == (500 * MiB, 850 * MiB)
    assert r["fragmentation_at_peak"] is None and r["fragmentation_at_end"] is None
    assert (r["failed_allocations"], r["leaked_bytes"]) == (0, 50 * MiB)
    streams = {size: stream for op, size, stream in cache.calls if op == "alloc"}
    assert streams[100 * MiB] == 0 and streams[50 * MiB] != 0, "malloc under the log's stream"
    assert cache.active == {} and cache.reserved == 0


def test_fit_finds_the_smallest_limit(peer_log, fakes):
    torch_cache, cupy_pools = fakes
    fits = _replay_peers.fit_rows([peer_log], ["torch", "cupy"],
                                  _replay_peers.prepare_peers(["torch", "cupy"]), gpu=False)
    for fit in fits:
        assert fit["driver"] == "python" and fit["reason"] is None
        assert fit["device_bytes"] == 500 * MiB, fit
        assert 495 * MiB <= fit["failing_bytes"] < 500 * MiB
        assert fit["replays"] >= 2
    assert torch_cache.limit == 1 << 30, "the fraction is set back to the whole device"
    assert len(cupy_pools) == fits[1]["replays"], "a pool per try"
    assert all(c.reserved == 0 for c in cupy_pools)


def test_fit_limit_searches_as_the_engine():
    outcome = _replay_peers.fit_limit(lambda limit: limit >= 3_000_000_000, 10, 80 << 30)
    assert outcome.limit is not None and outcome.limit >= 3_000_000_000
    assert outcome.limit - outcome.failing <= 0.01 * outcome.limit
    nowhere = _replay_peers.fit_limit(lambda limit: False, 1 << 20, 64 << 20)
    assert nowhere.limit is None and nowhere.failing == 64 << 20 and nowhere.reason


def test_snapshot_free_blocks():
    def segment(*blocks):
        return {"blocks": [{"size": s, "state": st} for s, st in blocks]}

    assert _replay_peers.snapshot_free_blocks([]) == []
    assert _replay_peers.snapshot_free_blocks(
        [segment((10, "active_allocated"), (30, "inactive")), segment((10, "inactive"))]
    ) == [30, 10]


def test_an_adapter_that_cannot_be_made_is_a_row(peer_log):
    def broken() -> _replay_peers.Adapter:
        raise RuntimeError("no device")

    row = _replay_peers._replay_closing(_rrmm.ReplayLog(peer_log), "torch", broken, 1, "s")
    assert (row["resource"], row["driver"], row["setup"]) == ("torch", "python", "s")
    assert row["error"] == "RuntimeError: no device" and row["ns_per_event"] is None


def test_a_closed_adapter_lets_its_resource_go(peer_log, monkeypatch):
    """On a GPU each rrmm resource driven from Python holds a pool: it must be gone before the
    next row builds its own."""
    from rrmm import _stack

    made: list = []
    build = _stack.build

    def recording(*args, **kwargs):
        mr = build(*args, **kwargs)
        made.append(mr)
        return mr

    monkeypatch.setattr(_stack, "build", recording)
    adapter = _replay_peers.rrmm_adapter("pool", 1 << 30, {}, None)
    assert adapter.device is None
    row = _replay_peers.replay(_rrmm.ReplayLog(peer_log), adapter, timed=False)
    assert row["error"] is None and row["peak_footprint"] is not None
    pool = made.pop()
    held = sys.getrefcount(pool)  # the adapter's functions, this name, the call's argument
    adapter.close()
    after = sys.getrefcount(pool)
    assert after == 2 < held, "only this test holds the pool now"
    with pytest.raises(RuntimeError, match="closed"):
        adapter.allocate(1, 0)


# ------------------------------------------------------------------------------- the command


def test_the_table_labels_each_rows_driver(capsys, peer_log, fakes, allow_simulated_peers):
    code, out, err = run(capsys, peer_log, "--simulate", "2GiB", "--compare",
                         "pool,torch,cupy", "--repeat", "2")
    assert code == 0, err
    print(out, file=sys.stderr)  # the sample table, shown with -s
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("resource"))
    assert lines[top].split()[:3] == ["resource", "driver", "ns/event"]
    rows = []
    for line in lines[top + 2:]:
        if line.startswith(" "):
            break
        rows.append(line.split())
    labels = [(row[0], row[1]) if row[1] != "(python)" else (row[0] + " (python)", row[2])
              for row in rows]
    assert labels == [("pool", "rust"), ("pool (python)", "python"), ("torch", "python"),
                      ("cupy", "python")]
    assert "driven from Python alike, ns/event relative to pool (python): torch " in out
    assert "torch: PyTorch 0.0+fake caching allocator" in out
    assert "pool (python): " in out and "called through rrmm's Python API" in out


def test_json_has_the_python_rows_with_the_same_keys(capsys, peer_log, fakes,
                                                     allow_simulated_peers):
    code, out, err = run(capsys, peer_log, "--simulate", "2GiB", "--compare",
                         "pool,torch,cupy", "--repeat", "1", "--json", "--fit")
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["reports"]
    assert [(r["resource"], r["driver"]) for r in rows] == [
        ("pool", "rust"), ("pool", "python"), ("torch", "python"), ("cupy", "python")]
    assert len({frozenset(r) for r in rows}) == 1, "every row has the same keys"
    rust, python, torch, cupy = rows
    for key in ("peak_bytes_in_use", "peak_footprint", "fragmentation_at_peak",
                "fragmentation_at_end", "failed_allocations", "leaked_bytes"):
        assert python[key] == rust[key], key
    assert torch["peak_footprint"] == cupy["peak_footprint"] == 850 * MiB
    assert [(f["resource"], f["driver"]) for f in doc["fits"]] == [
        ("pool", "rust"), ("torch", "python"), ("cupy", "python")]
    assert doc["fits"][1]["device_bytes"] == 500 * MiB


def test_fit_text_says_what_the_peers_limit(capsys, peer_log, fakes, allow_simulated_peers):
    code, out, err = run(capsys, peer_log, "--simulate", "2GiB", "--compare", "torch",
                         "--repeat", "1", "--fit")
    assert code == 0, err
    assert "smallest memory limit on the GPU" in out
    assert "torch needs 500.00 MiB: a memory limit on the GPU " \
           "(torch.cuda.set_per_process_memory_fraction)" in out


def test_check_counts_the_peers_failures(capsys, peer_log, monkeypatch, allow_simulated_peers):
    torch, _ = make_torch(400 * MiB)
    monkeypatch.setitem(sys.modules, "torch", torch)
    code, out, err = run(capsys, peer_log, "--simulate", "2GiB", "--compare", "pool,torch",
                         "--repeat", "1", "--check")
    assert code == 3 and "allocations failed on: torch" in err
    assert "1 allocation(s) failed (500.00 MiB), at events 4" in out


def test_simulate_is_refused_with_peers(capsys, peer_log, fakes):
    code, out, err = run(capsys, peer_log, "--simulate", "1GiB", "--compare", "pool,torch")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert "torch can only be replayed on the GPU" in err and "--simulate" in err


@pytest.mark.parametrize("missing", ["torch", "cupy"])
def test_a_missing_framework_is_one_line(capsys, peer_log, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    code, out, err = run(capsys, peer_log, "--compare", f"pool,{missing}")
    assert code == 2 and out == "" and err.strip().count("\n") == 0
    assert f"{missing} is not installed (pip install" in err


def test_no_gpu_is_one_line(capsys, peer_log, fakes, monkeypatch):
    monkeypatch.setattr(_rrmm, "replay_gpu_available", lambda: False)
    code, out, err = run(capsys, peer_log, "--compare", "torch,cupy")
    assert code == 2 and out == ""
    assert "torch and cupy need a GPU and none was found" in err


def test_a_framework_without_cuda_is_one_line(capsys, peer_log, monkeypatch):
    torch, _ = make_torch(available=False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(_rrmm, "replay_gpu_available", lambda: True)
    code, out, err = run(capsys, peer_log, "--compare", "torch")
    assert code == 2 and out == "" and "torch sees no CUDA device" in err


def test_unknown_names_mention_the_peers(capsys, peer_log):
    code, _, err = run(capsys, peer_log, "--simulate", "1GiB", "--compare", "pool,jax")
    assert code == 2 and "on a GPU also torch, cupy" in err


def test_nothing_imports_the_frameworks_unless_named(peer_log):
    code = f"""
import sys
from rrmm.__main__ import main
import rrmm._replay_peers, rrmm._cli_replay
assert main(["replay", {peer_log!r}, "--simulate", "1GiB", "--compare", "pool,expandable",
             "--repeat", "1"]) == 0
assert "torch" not in sys.modules and "cupy" not in sys.modules, "imported"
print("CHILD OK")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0 and "CHILD OK" in proc.stdout, proc.stderr


# ------------------------------------------------------------------------------- random logs


#: Sizes in 64 KiB units up to 2 MiB (some zero).
SIZES_64K = st.integers(0, 32).map(lambda k: k * (64 << 10))


@st.composite
def random_logs(draw: st.DrawFn, sizes: st.SearchStrategy[int] = SIZES_64K,
                steps: int = 60) -> str:
    """An RMM log of random allocations (``sizes``: by default in 64 KiB units up to 2 MiB;
    some of zero bytes, on two streams) and frees of live ones; some never freed."""
    lines = [HEADER]
    live: list[tuple[int, int, str]] = []
    address = 0x7F00_0000_0000
    for step in range(draw(st.integers(1, steps))):
        stream = draw(st.sampled_from(["0", OTHER_STREAM]))
        if live and draw(st.booleans()):
            ptr, size, _ = live.pop(draw(st.integers(0, len(live) - 1)))
            lines.append(f"1,t{step},free,{ptr:#x},{size},{stream}")
            continue
        size = draw(sizes)
        if size == 0:
            lines.append(f"1,t{step},allocate,(nil),0,{stream}")
            continue
        address += 4 << 20
        live.append((address, size, stream))
        lines.append(f"1,t{step},allocate,{address:#x},{size},{stream}")
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=random_logs(), total_mib=st.integers(1, 64))
def test_random_logs_through_the_fake_torch(tmp_path, text, total_mib):
    path = tmp_path / "random.csv"
    path.write_text(text)
    r, cache = replay_torch(str(path), total=total_mib * MiB, repeat=None, timed=False)
    assert r["failed_allocations"] + cache.successes == r["allocations"] == sum(
        1 for op, _, _ in cache.calls if op == "alloc")
    assert len(r["failure_events"]) == r["failed_allocations"]
    assert r["peak_bytes_in_use"] <= r["log_peak_bytes"]
    if r["failed_allocations"] == 0:
        assert r["peak_bytes_in_use"] == r["log_peak_bytes"]
    assert cache.requested_in_use == 0 and cache.active == {}, "everything freed, once"
    assert r["peak_footprint"] is not None and r["peak_footprint"] >= r["peak_bytes_in_use"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=random_logs(), device_mib=st.integers(2, 24))
def test_random_logs_from_python_match_the_engine(tmp_path, text, device_mib):
    """rrmm's pool driven from Python fails, peaks and holds as the engine's row."""
    path = tmp_path / "random.csv"
    path.write_text(text)
    simulate = device_mib * MiB
    engine = _rrmm.replay_logs([str(path)], ["pool"], simulate=simulate, timed=False)
    rows = _replay_peers.replay_rows([str(path)], ["pool"], engine, {}, options={},
                                     simulate=simulate, repeat=1)
    rust, python = rows
    assert python["driver"] == "python" and python["error"] is None, python["error"]
    for key in ("failed_allocations", "failure_events", "failed_bytes", "peak_bytes_in_use",
                "peak_footprint", "footprint_at_end", "leaked_allocations", "leaked_bytes"):
        assert python[key] == rust[key], key


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=random_logs(st.integers(0, 3 * MiB), 50), device_mib=st.integers(1, 12),
       repeat=st.integers(0, 2))
def test_the_engine_over_python_functions_agrees_with_the_simulated_kind(
        tmp_path, text, device_mib, repeat):
    """The same log through the test peer (charging as the simulated device does) and through
    rrmm's simulated kind: the same failures, peaks, footprint and leaks; every allocation the
    peer made is freed once."""
    path = tmp_path / "random.csv"
    path.write_text(text)
    capacity = device_mib * MiB
    timed = {"repeat": repeat} if repeat else {"timed": False}  # 0: the figures pass alone
    engine = _rrmm.replay_logs([str(path)], ["simulated"], simulate=capacity, **timed)[0]
    a = AddressAllocator(capacity)
    row = replay_fake(str(path), a, repeat=repeat or None)
    assert row["error"] is None and engine["error"] is None
    for key in ("events", "allocations", "failed_allocations", "failure_events", "failed_bytes",
                "peak_bytes_in_use", "peak_footprint", "footprint_at_end", "leaked_allocations",
                "leaked_bytes", "repeats"):
        assert row[key] == engine[key], key
    passes = 1 + repeat
    made = row["allocations"] - row["failed_allocations"]
    assert (a.allocations, a.failures) == (passes * made, passes * row["failed_allocations"])
    zero = text.count(",allocate,(nil),0,")
    assert a.frees == passes * (made - zero), "every allocation freed once, after each pass"
    assert a.live == {} and a.charged == 0
