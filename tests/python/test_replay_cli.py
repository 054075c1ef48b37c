"""``python -m rrmm replay`` on CPU: simulated memory, small hand-written logs with known figures,
the shared traces (figures from an independent pass over the CSV), the table, the JSON, the
plot (pixels checked), and every bad-input case."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rrmm
from rrmm.__main__ import main
from rrmm._cli_replay import parse_size

HEADER = "Thread,Time,Action,Pointer,Size,Stream"

# Two threads, two streams; peak 4096 bytes in use (1024 + 3072 rounded, 1000 + 3000 requested);
# one failure recorded by the original run; one allocation (500 bytes) never freed.
SMALL_LOG = f"""{HEADER}
101,10:00:00.000001,allocate,0x7f0000000000,1000,0
101,10:00:00.000002,allocate,0x7f0000000400,3000,0x55d0c2a1e0f0
102,10:00:00.000003,allocate failure,(nil),1099511627776,0
101,10:00:00.000004,free,0x7f0000000000,1000,0
102,10:00:00.000005,allocate,0x7f0000000000,500,0x55d0c2a1e0f0
101,10:00:00.000006,free,0x7f0000000400,3000,0x55d0c2a1e0f0
101,10:00:00.000007,allocate,0x7f0000001000,256,0
101,10:00:00.000008,free,0x7f0000001000,256,0
"""

def shipped(name: str) -> str:
    """The shipped trace ``name``; a missing one fails the test."""
    from rrmm import traces

    path = traces.path(name)
    assert path.is_file(), f"{path} is missing"
    return str(path)


def replay(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def replay_json(capsys, *args: str) -> dict:
    if "--repeat" not in args:
        args = (*args, "--repeat", "2")
    code, out, err = replay(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def small_log(tmp_path: Path) -> str:
    path = tmp_path / "small.csv"
    path.write_text(SMALL_LOG)
    return str(path)


def write_log(tmp_path: Path, body: str, name: str = "bad.csv") -> str:
    path = tmp_path / name
    path.write_text(HEADER + "\n" + body + "\n")
    return str(path)


@pytest.mark.parametrize(
    "text, value",
    [("4GiB", 4 << 30), ("512 MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("1000", 1000)],
)
def test_parse_size_is_the_apis_parse_bytes(text, value):
    assert parse_size(text) == value == rrmm.parse_bytes(text)


@pytest.mark.parametrize("bad", ["", "GiB", "4XB", "-1GiB", "1e400", "4G", "2k", " 4GiB"])
def test_a_size_the_api_refuses_is_a_usage_error(bad):
    with pytest.raises(ValueError, match="as a byte specification"):
        rrmm.parse_bytes(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="as a byte specification"):
        parse_size(bad)


def test_small_log_figures(capsys, small_log):
    doc = replay_json(capsys, small_log, "--simulate", "1GiB", "--resource", "pool")
    assert doc["memory"] == "simulated"
    assert doc["simulated_bytes"] == 1 << 30
    (r,) = doc["reports"]
    assert r["log"] == small_log
    assert r["resource"] == "pool"
    assert r["events"] == 7
    assert r["allocations"] == 4
    assert r["peak_bytes_in_use"] == 4000
    assert r["log_peak_bytes"] == 4000
    assert r["failed_allocations"] == 0
    assert r["failure_events"] == []
    assert r["leaked_allocations"] == 1
    assert r["leaked_bytes"] == 500
    assert r["logged_failures"] == 1
    assert r["threads"] == 2
    assert r["streams"] == 2
    assert r["parse_warnings"] == 0
    assert r["peak_footprint"] >= 4096
    assert 0.0 <= r["fragmentation_at_peak"] <= 1.0
    assert 0.0 <= r["fragmentation_at_end"] <= 1.0
    assert r["ns_per_event"] > 0
    assert r["total_ns"] > 0
    # The timeline is in every JSON report (issue 50: it was only with --plot).
    assert set(r["timeline"]) == {"event", "bytes_in_use", "footprint", "beyond_device"}


def test_gzipped_log_gives_the_same_figures(capsys, tmp_path, small_log):
    gz = tmp_path / "small.csv.gz"
    gz.write_bytes(gzip.compress(SMALL_LOG.encode()))
    plain = replay_json(capsys, small_log, "--simulate", "1GiB")["reports"][0]
    packed = replay_json(capsys, str(gz), "--simulate", "1GiB")["reports"][0]
    keys = ["events", "peak_bytes_in_use", "leaked_allocations", "leaked_bytes", "peak_footprint"]
    for key in keys:
        assert plain[key] == packed[key]


def test_failures_on_a_small_simulated_device(capsys, tmp_path):
    log = write_log(
        tmp_path,
        # The third allocation finds 4096 of 4096 bytes in use and fails; its free is skipped.
        """1,t,allocate,0x1000,1000,0
1,t,allocate,0x2000,3000,0
1,t,allocate,0x3000,256,0
1,t,free,0x3000,256,0
1,t,free,0x1000,1000,0
1,t,free,0x2000,3000,0""",
        "fail.csv",
    )
    r = replay_json(capsys, log, "--simulate", "4KiB", "--resource", "simulated")["reports"][0]
    assert r["failed_allocations"] == 1
    assert r["failure_events"] == [2]
    assert r["failed_bytes"] == 256
    assert r["peak_bytes_in_use"] == 4000
    assert r["leaked_allocations"] == 0
    code, out, _ = replay(capsys, log, "--simulate", "4KiB", "--resource", "simulated")
    assert code == 0
    assert "1 !" in out  # the failed column is marked
    assert "1 allocation(s) failed (256 B), at events 2" in out


def test_comparison_table(capsys, small_log):
    code, out, _ = replay(
        capsys, small_log, "--simulate", "1GiB", "--compare", "pool,binning,fixed_size,simulated",
        "--repeat", "2",
    )
    assert code == 0
    lines = out.splitlines()
    # The log's own properties once, in the header.
    assert lines[0].startswith(f"{small_log}: 7 events, 2 thread(s), 2 stream(s), peak 3.91 KiB")
    assert "1 allocation(s) never freed, 1 failed allocation(s) logged (not replayed)" in lines[0]
    header = next(line for line in lines if line.startswith("resource"))
    for column in ["ns/event", "spread", "footprint", "overhead", "waste", "frag@peak",
                   "frag@end", "failed"]:
        assert column in header
    assert "leaks" not in header
    rows = {line.split()[0]: line for line in lines
            if line.split() and line.split()[0] in {"pool", "binning", "fixed_size", "simulated"}}
    assert set(rows) == {"pool", "binning", "fixed_size", "simulated"}
    assert rows["simulated"].split()[0] == "simulated"
    # Each resource's setup is printed.
    assert "  pool: coalescing pool, initial 512.00 MiB (half the free memory)" in out
    assert "  binning: bins 2^18..2^22 (256.00 KiB..4.00 MiB) x 128 blocks per chunk" in out
    assert "  fixed_size: 1.00 MiB blocks, 128 per chunk" in out
    assert "simulated: the simulated device itself; its timings are the simulator's, not " \
        "CUDA's" in out
    assert "median of 2 repetition(s) after a warm-up" in out


def test_compare_all_and_json_of_several_logs(capsys, tmp_path, small_log):
    other = tmp_path / "other.csv"
    other.write_text(HEADER + "\n1,t,allocate,0x10,100,0\n1,t,free,0x10,100,0\n")
    doc = replay_json(capsys, small_log, str(other), "--simulate", "1GiB", "--compare", "all")
    pairs = [(r["log"], r["resource"]) for r in doc["reports"]]
    # Every kind replay builds (issue 39: tiered and the pinned kinds were left out); the
    # source resources (cuda, cuda_async, pinned) are the one simulated row.
    names = ["pool", "expandable", "binning", "arena", "fixed_size", "managed", "managed_pool",
             "fallback", "any_size", "tiered", "pinned_pool", "pinned_expandable", "simulated"]
    assert pairs == [(small_log, n) for n in names] + [(str(other), n) for n in names]
    assert all(r["peak_bytes_in_use"] == 100 for r in doc["reports"][len(names) :])


def test_shipped_traces_figures(capsys):
    # From an independent pass over the CSV: (events, allocations, peak bytes in use, leaks,
    # leaked bytes, threads).
    expected = {
        "random_10k_1mib": (20_000, 10_000, 3_309_099_223, 0, 0, 1),
        "transformer_training": (21_949, 11_046, 1_313_089_416, 105, 234_633_728, 2),
    }
    for name, (events, allocs, peak, leaks, leaked_bytes, threads) in expected.items():
        doc = replay_json(capsys, name, "--simulate", "64GiB", "--compare", "pool,binning",
                          "--repeat", "1")
        assert shipped(name).endswith(f"{name}.csv.gz")
        for r in doc["reports"]:
            assert r["log"] == f"{name}.csv.gz"  # the file name, not the installed path
            assert r["events"] == events
            assert r["allocations"] == allocs
            assert r["peak_bytes_in_use"] == peak
            assert r["log_peak_bytes"] == peak
            assert (r["leaked_allocations"], r["leaked_bytes"]) == (leaks, leaked_bytes)
            assert r["log_unfreed_allocations"] == leaks
            assert r["failed_allocations"] == 0
            assert r["threads"] == threads
            assert r["peak_footprint"] >= peak
            assert r["overhead"] == pytest.approx(r["peak_footprint"] / peak)


def test_plot_is_a_png_that_is_not_blank(capsys, tmp_path, small_log):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    out = tmp_path / "replay.png"
    doc = replay_json(
        capsys, small_log, "--simulate", "4KiB", "--compare", "simulated,pool", "--plot", str(out)
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = doc["reports"][0]
    assert r["timeline"]["event"][0] == 0
    assert r["timeline"]["event"][-1] == 7
    image = mpimg.imread(str(out))
    height, width = image.shape[:2]
    assert width > 200 and height > 200
    rgb = image[..., :3]
    non_white = (rgb < 0.95).any(axis=-1).mean()
    assert non_white > 0.01, "the plot is blank"
    colours = {tuple(px) for px in (rgb.reshape(-1, 3) * 255).astype(int)[:: 7].tolist()}
    assert len(colours) > 10, "the plot has no lines"


def test_plot_without_matplotlib_names_the_extra(capsys, small_log, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = str(tmp_path / "x.png")
    code, _, err = replay(capsys, small_log, "--simulate", "1GiB", "--plot", png)
    assert code == 1
    # rrmm is not on PyPI (issue 50): the hint installs matplotlib, or the extra from a checkout.
    assert "pip install matplotlib" in err and "pip install '.[plot]'" in err
    assert "rrmm is not on PyPI" in err and "'rrmm[plot]'" not in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "body, line, needle",
    [
        ("1,t,allocate,0x200,10", 2, "expected 6"),
        ("1,t,reallocate,0x200,10,0", 2, "unknown action"),
        ("1,t,free,0x300,10,0", 2, "never allocated"),
        ("1,t,allocate,0xZZ,10,0", 2, "malformed pointer"),
        ("1,t,allocate,0x200,ten,0", 2, "malformed size"),
        ("x,t,allocate,0x200,10,0", 2, "malformed thread"),
    ],
)
def test_bad_input_names_file_and_line(capsys, tmp_path, body, line, needle):
    log = write_log(tmp_path, body)
    code, out, err = replay(capsys, log, "--simulate", "1GiB")
    assert code == 2
    assert f"{log}:{line}: " in err
    assert needle in err
    assert "Traceback" not in err
    # Leniently: a counted warning, the line skipped.
    doc = replay_json(capsys, log, "--simulate", "1GiB", "--lenient")
    r = doc["reports"][0]
    assert r["parse_warnings"] == 1
    assert f"{log}:{line}: " in r["warning_messages"][0]
    code, out, err = replay(capsys, log, "--simulate", "1GiB", "--lenient")
    assert code == 0
    assert "1 bad line(s) skipped (--lenient)" in out


def test_double_free_is_reported_at_its_line(capsys, tmp_path):
    log = write_log(tmp_path, "1,t,allocate,0x100,10,0\n1,t,free,0x100,10,0\n1,t,free,0x100,10,0")
    code, _, err = replay(capsys, log, "--simulate", "1GiB")
    assert code == 2
    assert f"{log}:4: free of pointer 0x100" in err


def test_not_a_log_missing_file_and_bad_arguments(capsys, tmp_path, small_log):
    not_log = tmp_path / "x.csv"
    not_log.write_text("hello,world\n")
    code, _, err = replay(capsys, str(not_log), "--simulate", "1GiB")
    assert code == 2 and f"{not_log}:1: not an RMM log" in err
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    code, _, err = replay(capsys, str(empty), "--simulate", "1GiB")
    assert code == 2 and "empty log" in err
    code, _, err = replay(capsys, str(tmp_path / "missing.csv"), "--simulate", "1GiB")
    assert code == 2 and "missing.csv" in err
    code, _, err = replay(capsys, small_log, "--simulate", "1GiB", "--resource", "nope")
    assert code == 2 and "unknown resource 'nope'" in err
    code, _, err = replay(capsys, small_log, "--simulate", "1GiB", "--compare", ",")
    assert code == 2 and "--compare names no resource" in err


def test_python_dash_m_runs_the_command(small_log):
    result = subprocess.run(
        [sys.executable, "-m", "rrmm", "replay", small_log, "--simulate", "1GiB", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reports"][0]["events"] == 7


def test_without_gpu_or_simulate_uses_default_simulated_memory(capsys, small_log):
    from rrmm import _rrmm

    if _rrmm.replay_gpu_available():
        pytest.skip("a GPU is present: the replay runs on it")
    code, out, err = replay(capsys, small_log, "--json", "--repeat", "1")
    assert code == 0
    assert "no GPU found; replaying on simulated memory of 80.00 GiB" in err
    doc = json.loads(out)
    assert doc["memory"] == "simulated" and doc["simulated_bytes"] == 80 << 30


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ["--resource", "--compare", "--simulate", "--initial-pool-size",
                   "--maximum-pool-size", "--bins", "--block-size", "--blocks", "--repeat",
                   "--fit", "--plot", "--json", "--lenient"]:
        assert option in out
    # Every option has help text.
    from rrmm import _cli_replay

    parser = _cli_replay.add_parser(argparse.ArgumentParser().add_subparsers())
    for action in parser._actions:
        assert action.help, action.option_strings
    for figure in ["ns/event", "spread", "footprint", "overhead", "waste", "frag@peak",
                   "failed", "1 - largest free block / free bytes"]:
        assert figure in out
    for name in ["pool", "binning", "fixed_size", "cuda_async", "cuda", "managed", "simulated"]:
        assert f"  {name} " in out


def test_shipped_trace_by_name_replays_like_its_file(capsys):
    from rrmm import traces

    assert "transformer_training" in traces.names()
    by_name = replay_json(capsys, "transformer_training", "--simulate", "80GiB", "--resource",
                          "pool", "--repeat", "1")
    path = str(traces.path("transformer_training"))
    by_path = replay_json(capsys, path, "--simulate", "80GiB", "--resource", "pool",
                          "--repeat", "1")
    (a,), (b,) = by_name["reports"], by_path["reports"]
    assert a["log"] == "transformer_training.csv.gz"
    assert b["log"] == path
    code, out, _ = replay(capsys, "transformer_training", "--simulate", "80GiB", "--repeat", "1")
    assert code == 0
    assert out.startswith("transformer_training.csv.gz: 21949 events")
    assert "site-packages" not in out
    for key in ("events", "allocations", "peak_bytes_in_use", "peak_footprint", "leaked_bytes"):
        assert a[key] == b[key], key
    assert a["events"] > 20000
    assert a["failed_allocations"] == 0


def test_unknown_name_is_reported_as_a_missing_file(capsys):
    code, _, err = replay(capsys, "no_such_trace_anywhere", "--simulate", "1GiB")
    assert code == 2
    assert "no_such_trace_anywhere" in err


# Hand-computed figures. The log: A=1000, B=3000, free A, C=500, free B; C never freed.
# Peak in use 4000 (A+B), 500 at the end.
HAND_LOG = f"""{HEADER}
1,t,allocate,0xa000,1000,0
1,t,allocate,0xb000,3000,0
1,t,free,0xa000,1000,0
1,t,allocate,0xc000,500,0
1,t,free,0xb000,3000,0
"""

MIB = 1 << 20
# pool (initial 1 MiB): holds 1 MiB throughout; blocks are 256-rounded (1024 + 3072 at the
# peak: waste 96; 512 for C at the end: waste 12). At the peak the free memory is one block.
# At the end C took the start of A's freed block, and B's freed block merged with the rest of
# it, [512, 4096), which the pool keeps apart from the never-used (fresh) memory [4096, 1 MiB);
# the two touch, so they are one free region (a request of their size succeeds): no
# fragmentation (issue 29: the figures counted them as two).
# binning (bins 1, 2, 4 KiB x 4 blocks, over the same pool): the bins take 4 + 8 + 16 KiB of
# the pool; A -> 1 KiB bin, B -> 4 KiB bin, C -> 1 KiB bin. Waste: 1024 + 4096 - 4000 at the
# peak, 1024 - 500 at the end. Free: the pool's one block (MIB - 28 KiB) plus the bins' free
# blocks (3 + 8 + 12 KiB at the peak; 3 + 8 + 16 KiB at the end); largest: the pool's.
# fixed_size (4 KiB x 4 blocks): holds 16 KiB; waste 8192 - 4000, then 4096 - 500; free
# blocks of 4 KiB: 2 at the peak (fragmentation 1/2), 3 at the end (2/3).
# simulated: charges 1024 + 3072 at the peak (overhead 1.024), 512 at the end; never fragments.
POOL_FREE = MIB - 28 * 1024
HAND = {
    "pool": (MIB, MIB / 4000, 96, 12, 0.0, 0.0),
    "binning": (MIB, MIB / 4000, 1120, 524, 1 - POOL_FREE / (POOL_FREE + 23 * 1024),
                1 - POOL_FREE / (POOL_FREE + 27 * 1024)),
    "fixed_size": (16384, 16384 / 4000, 4192, 3596, 0.5, 2 / 3),
    "simulated": (4096, 4096 / 4000, 96, 12, 0.0, 0.0),
}


def test_overhead_waste_and_fragmentation_match_hand_computed_values(capsys, tmp_path):
    log = tmp_path / "hand.csv"
    log.write_text(HAND_LOG)
    doc = replay_json(
        capsys, str(log), "--simulate", "1GiB", "--compare", "pool,binning,fixed_size,simulated",
        "--initial-pool-size", "1MiB", "--bins", "10:12", "--blocks", "4", "--block-size", "4KiB",
    )
    assert [r["resource"] for r in doc["reports"]] == list(HAND)
    for r in doc["reports"]:
        footprint, overhead, waste_peak, waste_end, frag_peak, frag_end = HAND[r["resource"]]
        name = r["resource"]
        assert r["peak_bytes_in_use"] == 4000, name
        assert r["peak_footprint"] == footprint, name
        assert r["overhead"] == pytest.approx(overhead), name
        assert r["internal_waste_at_peak"] == waste_peak, name
        assert r["internal_waste_at_end"] == waste_end, name
        assert r["fragmentation_at_peak"] == pytest.approx(frag_peak), name
        assert r["fragmentation_at_end"] == pytest.approx(frag_end), name
        assert r["failed_allocations"] == 0, name
        assert (r["leaked_allocations"], r["leaked_bytes"]) == (1, 500), name


ISSUE_LOG = f"""{HEADER}
1,00:00:00.000001,allocate,0x1000,12884901888,0
1,00:00:00.000002,allocate,0x2000,8589934592,0
1,00:00:00.000003,free,0x1000,12884901888,0
1,00:00:00.000004,allocate,0x3000,21474836480,0
1,00:00:00.000005,free,0x2000,8589934592,0
1,00:00:00.000006,free,0x3000,21474836480,0
"""


def test_the_issue_log_fits_the_simulated_device_but_not_the_pool(capsys, tmp_path):
    # 12 GiB, 8 GiB, free the 12, 20 GiB on 32 GiB: the driver maps pages wherever they are,
    # so the device serves it; the pool's chunks (16 GiB initial, 16 GiB grown) never coalesce.
    log = tmp_path / "issue.csv"
    log.write_text(ISSUE_LOG)
    doc = replay_json(capsys, str(log), "--simulate", "32GiB", "--compare", "cuda,pool")
    device, pool = doc["reports"]
    assert device["resource"] == "simulated" and device["simulated_device"]
    assert device["failed_allocations"] == 0
    assert device["peak_bytes_in_use"] == 28 << 30
    assert pool["resource"] == "pool"
    assert pool["failed_allocations"] == 1
    assert pool["failure_events"] == [3]


def test_source_resources_are_one_simulated_device_row(capsys, small_log):
    doc = replay_json(capsys, small_log, "--simulate", "1GiB", "--compare",
                      "cuda,cuda_async,managed,pool")
    # cuda and cuda_async are the device itself; managed memory is its own row (the device
    # with host memory beyond it).
    assert [r["resource"] for r in doc["reports"]] == ["simulated", "managed", "pool"]
    assert [r["simulated_device"] for r in doc["reports"]] == [True, False, False]
    code, out, _ = replay(capsys, small_log, "--simulate", "1GiB", "--compare", "all",
                          "--repeat", "1")
    assert code == 0
    # One vocabulary (issue 31): the row is named "simulated" (as in --json and the fit line)
    # and stands for cuda and cuda_async, never for managed (its own row).
    assert any(line.split()[:1] == ["simulated"] for line in out.splitlines())
    setup = next(line for line in out.splitlines() if line.startswith("  simulated: "))
    assert setup.endswith("stands for cuda and cuda_async"), setup
    for base in ["cuda", "cuda_async"]:
        assert not any(line.split()[:1] == [base] for line in out.splitlines())
    assert any(line.split()[:1] == ["managed"] for line in out.splitlines())


def test_managed_memory_on_a_simulated_device_reports_bytes_beyond_it(capsys, tmp_path):
    mib = 1 << 20
    log = tmp_path / "spill.csv"
    # 6 MiB, then 4 MiB more on an 8 MiB device: 2 MiB beyond; free the 6; then 8 MiB: 4 MiB
    # beyond (the peak), all in 2 MiB pages.
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   f"1,t,allocate,0x1000,{6 * mib},0\n"
                   f"1,t,allocate,0x2000,{4 * mib},0\n"
                   f"1,t,free,0x1000,{6 * mib},0\n"
                   f"1,t,allocate,0x3000,{8 * mib},0\n"
                   f"1,t,free,0x2000,{4 * mib},0\n"
                   f"1,t,free,0x3000,{8 * mib},0\n")
    doc = replay_json(capsys, str(log), "--simulate", "8MiB", "--compare",
                      "managed,managed_pool,simulated", "--repeat", "1")
    managed, pool, device = doc["reports"]
    assert managed["failed_allocations"] == 0
    assert managed["peak_beyond_device"] == 4 * mib
    assert pool["failed_allocations"] == 0
    assert pool["peak_beyond_device"] is not None and pool["peak_beyond_device"] >= 4 * mib
    assert device["failed_allocations"] == 1
    assert device["peak_beyond_device"] is None
    code, out, _ = replay(capsys, str(log), "--simulate", "8MiB", "--resource", "managed",
                          "--repeat", "1")
    assert code == 0
    header, _, row = out.splitlines()[1:4]
    assert header.split()[-1] == "beyond"
    assert row.split()[-2:] == ["4.00", "MiB"]
    # A host tier too small for the peak: the allocation that passes it fails.
    doc = replay_json(capsys, str(log), "--simulate", "8MiB", "--resource", "managed",
                      "--host-memory", "2MiB", "--repeat", "1")
    assert doc["reports"][0]["failure_events"] == [3]


def test_repeated_timings_with_spread_in_the_json(capsys, small_log):
    (r,) = replay_json(capsys, small_log, "--simulate", "1GiB", "--repeat", "7")["reports"]
    assert r["repeats"] == 7
    assert len(r["samples_ns"]) == 7
    assert all(t > 0 for t in r["samples_ns"])
    samples = sorted(r["samples_ns"])
    assert r["total_ns"] == samples[3]  # the median
    assert r["ns_per_event"] == pytest.approx(samples[3] / 7)
    assert r["ns_per_event_min"] == pytest.approx(samples[0] / 7)
    assert r["ns_per_event_max"] == pytest.approx(samples[-1] / 7)
    # Quartiles by nearest rank of 7: the 2nd and 5th fastest.
    assert r["ns_per_event_p25"] == pytest.approx(samples[2] / 7)
    assert r["ns_per_event_p75"] == pytest.approx(samples[5] / 7)
    assert r["spread"] == pytest.approx((samples[5] - samples[2]) / samples[3])


def test_default_repeats_at_least_five_and_half_a_second(capsys, small_log):
    code, out, err = replay(capsys, small_log, "--simulate", "1GiB", "--json")
    assert code == 0, err
    (r,) = json.loads(out)["reports"]
    # At least 5 repetitions and 0.5 s of them, at most 1000 (this log takes microseconds).
    assert r["repeats"] >= 5
    assert sum(r["samples_ns"]) >= 0.5e9 or r["repeats"] == 1000


def test_sums_are_exact_beyond_64_bits(capsys, tmp_path):
    log = write_log(tmp_path, "1,t,allocate,0x1000,9223372036854775808,0\n"
                              "1,t,allocate,0x2000,9223372036854775808,0", "huge.csv")
    (r,) = replay_json(capsys, log, "--simulate", "1GiB", "--resource", "simulated")["reports"]
    assert r["failed_allocations"] == 2
    assert r["failed_bytes"] == 2**64
    assert r["log_peak_bytes"] == 2**64


def test_a_resource_that_cannot_be_built_is_its_own_row(capsys):
    # Five bins of 128 blocks need 992 MiB of pool: more than the maximum of 512 MiB.
    args = ("transformer_training", "--simulate", "32GiB", "--compare", "pool,binning,cuda",
            "--maximum-pool-size", "512MiB", "--initial-pool-size", "256MiB")
    doc = replay_json(capsys, *args, "--repeat", "1")
    pool, binning, device = doc["reports"]
    assert binning["error"].startswith("cannot be built: ")
    assert "out_of_memory" in binning["error"]
    assert pool["error"] is None and device["error"] is None
    assert pool["events"] == device["events"] == 21949
    code, out, _ = replay(capsys, *args, "--repeat", "1")
    assert code == 0
    assert "    no figures: cannot be built: " in out


def test_fixed_size_says_why_it_fails(capsys):
    doc = replay_json(capsys, "transformer_training", "--simulate", "32GiB", "--resource",
                      "fixed_size", "--repeat", "1")
    (r,) = doc["reports"]
    assert r["failed_allocations"] == r["unservable_allocations"] == 7014
    code, out, _ = replay(capsys, "transformer_training", "--simulate", "32GiB", "--resource",
                          "fixed_size", "--repeat", "1")
    assert code == 0
    assert "7014 of them ask for more than its block size: it cannot serve them by design" in out
    # The largest request is 139,264,000 bytes: 136 MiB blocks serve every one (on a device
    # large enough for one block per live allocation).
    (r,) = replay_json(capsys, "transformer_training", "--simulate", "1TiB", "--resource",
                       "fixed_size", "--block-size", "136MiB", "--blocks", "4",
                       "--repeat", "1")["reports"]
    assert r["log_largest_request"] == 139_264_000
    assert r["failed_allocations"] == r["unservable_allocations"] == 0
    assert r["setup"].startswith("136.00 MiB blocks, 4 per chunk")


def test_fit_on_shipped_traces_is_checked_by_replaying(capsys):
    for name in ["transformer_training", "random_10k_1mib"]:
        doc = replay_json(capsys, name, "--simulate", "64GiB", "--compare",
                          "pool,binning,simulated", "--fit", "--repeat", "1")
        assert len(doc["fits"]) == 3
        for f in doc["fits"]:
            size = f["device_bytes"]
            assert size is not None, f
            assert f["failing_bytes"] < size
            assert size - f["failing_bytes"] <= max(size // 100, 256)
            if f["resource"] != "simulated":
                assert f["initial_pool_size"] is not None
            at = replay_json(capsys, name, "--simulate", str(size), "--resource", f["resource"],
                             "--repeat", "1")["reports"][0]
            assert at["failed_allocations"] == 0, (name, f)
            below = replay_json(capsys, name, "--simulate", str(size * 9 // 10), "--resource",
                                f["resource"], "--repeat", "1")["reports"][0]
            assert below["failed_allocations"] > 0, (name, f)
    code, out, _ = replay(capsys, "transformer_training", "--simulate", "64GiB", "--compare",
                          "pool,fixed_size,arena", "--fit", "--repeat", "1")
    assert "    arena needs " in out and "with arena_size=" in out
    assert code == 0
    assert "fit (smallest simulated device with no failed allocation):" in out
    assert "    pool needs " in out and "with initial_pool_size=" in out
    assert "    fixed_size fits on no device: 7014 request(s) above its largest block" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    from rrmm import __version__

    assert capsys.readouterr().out.strip() == f"rrmm {__version__}"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--compare", ""], "--compare names no resource"),
        (["--compare", " , "], "--compare names no resource"),
        (["--compare", "pool,nope"], "unknown resource 'nope'"),
        (["--plot", "out.txt"], "unknown file type '.txt'"),
        (["--plot", "out"], "unknown file type '(none)'"),
        (["--plot", "/no/such/dir/out.png"], "does not exist"),
        (["--initial-pool-size", "1000"], "multiple of 256"),
        (["--maximum-pool-size", "1000"], "multiple of 256"),
        (["--initial-pool-size", "2MiB", "--maximum-pool-size", "1MiB"], "exceeds"),
    ],
)
def test_misuse_is_a_one_line_error_before_any_replay(capsys, small_log, args, needle):
    code, out, err = replay(capsys, small_log, "--simulate", "1GiB", *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rrmm replay: error: ")
    assert needle in lines[0]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--simulate", "4XB"], "Could not parse '4XB' as a byte specification"),
        (["--initial-pool-size", "4G"], "a bare unit is not a size: write 4GiB for 4 * 2**30"),
        (["--simulate", "0"], "positive"),
        (["--repeat", "0"], "positive"),
        (["--repeat", "x"], "not a whole number"),
        (["--bins", "22:18"], "MIN <= MAX"),
        (["--bins", "18"], "MIN:MAX"),
        (["--block-size", "0"], "positive"),
        (["--blocks", "0"], "positive"),
        (["--blocks", "-3"], "positive"),
        (["--no-such-option"], "unrecognized arguments"),
        (["--compare"], "expected one argument"),
    ],
)
def test_bad_option_values_are_one_line_usage_errors(capsys, small_log, args, needle):
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", small_log, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith(("rrmm replay: error: ", "rrmm: error: "))
    assert needle in line


def test_unwritable_plot_is_refused_before_the_replay(capsys, small_log, tmp_path):
    folder = tmp_path / "folder.png"
    folder.mkdir()
    code, _, err = replay(capsys, small_log, "--simulate", "1GiB", "--plot", str(folder))
    assert code == 2 and "is a directory" in err
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        code, out, err = replay(capsys, small_log, "--simulate", "1GiB", "--plot",
                                str(locked / "x.png"))
        assert code == 2 and out == ""
        assert "not writable" in err
    finally:
        locked.chmod(0o700)


def test_plot_with_fit_and_failures_per_resource(capsys, tmp_path, small_log):
    pytest.importorskip("matplotlib")
    out = tmp_path / "fit.svg"
    code, text, err = replay(capsys, small_log, "--simulate", "4KiB", "--compare",
                             "simulated,pool,fixed_size", "--fit", "--plot", str(out),
                             "--repeat", "1")
    assert code == 0, err
    assert f"plot written to {out}" in text
    assert "fit (smallest simulated device with no failed allocation):" in text
    svg = out.read_text()
    # Legend entries: one per resource's footprint, failures and fit.
    for label in ["bytes in use", "pool: footprint", "fits in", "failed ("]:
        assert label in svg


def test_a_pinned_pattern_that_changes_does_not_grow_the_expandable_pool(capsys, tmp_path):
    # The pinned-memory users' pattern: 10 x 1 GiB, then 20 x 512 MiB, then 5 x 2 GiB, each
    # phase freed before the next, replayed on 64 GiB of simulated host memory.
    gib = 1 << 30
    rows, addr = [HEADER], 0x7F0000000000
    for count, size in ((10, gib), (20, gib // 2), (5, 2 * gib)):
        ptrs = [addr + i * size for i in range(count)]
        rows += [f"1,t,allocate,{p:#x},{size},0" for p in ptrs]
        rows += [f"1,t,free,{p:#x},{size},0" for p in ptrs]
    log = tmp_path / "pinned_pattern.csv"
    log.write_text("\n".join(rows) + "\n")
    doc = replay_json(capsys, str(log), "--simulate", "64GiB", "--compare",
                      "pinned_expandable,pinned_pool", "--initial-pool-size", "0",
                      "--repeat", "1")
    by = {r["resource"]: r for r in doc["reports"]}
    assert by["pinned_expandable"]["failed_allocations"] == 0
    # The expandable pool maps the first phase's 10 GiB (and some growth rounding) and reuses
    # it for the later phases.
    assert 10 * gib <= by["pinned_expandable"]["peak_footprint"] < 10.5 * gib
    # The pool cannot join its growth chunks: the 2 GiB phase grows it well past 10 GiB.
    assert by["pinned_pool"]["peak_footprint"] > 12 * gib


def test_check_exits_nonzero_only_when_an_allocation_fails(capsys, small_log):
    # The log peaks at 4096 bytes in use: a pool capped at 2048 bytes fails some of them.
    code, _, _ = replay(capsys, small_log, "--simulate", "1GiB", "--resource", "pool",
                        "--repeat", "1", "--check")
    assert code == 0
    code, _, err = replay(capsys, small_log, "--simulate", "1GiB", "--resource", "pool",
                          "--maximum-pool-size", "2048", "--initial-pool-size", "2048",
                          "--repeat", "1", "--check")
    assert code == 3, err
    assert "allocations failed on: pool" in err
    code, _, _ = replay(capsys, small_log, "--simulate", "1GiB", "--resource", "pool",
                        "--maximum-pool-size", "2048", "--initial-pool-size", "2048",
                        "--repeat", "1")
    assert code == 0  # without --check, a report, not a verdict


@pytest.mark.parametrize(("asked", "stands_for"), [
    ("pinned", "stands for pinned"),
    ("cuda", "stands for cuda"),
    ("cuda_async,managed", "stands for cuda_async"),
    ("cuda,cuda_async", "stands for cuda and cuda_async"),
])
def test_the_simulated_row_says_what_it_stands_for_alike_in_text_and_json(
        capsys, small_log, asked, stands_for):
    # Issue 31: `--resource pinned --simulate 64GiB` was labelled as standing for cuda,
    # cuda_async and managed; the row, the JSON and the fit line now use one name and say
    # which of the asked resources the simulated device stands for.
    code, out, _ = replay(capsys, small_log, "--simulate", "1GiB", "--compare", asked,
                          "--repeat", "1", "--fit")
    assert code == 0
    lines = out.splitlines()
    setup = next(line for line in lines if line.startswith("  simulated: "))
    assert setup.endswith(stands_for), setup
    assert "managed" not in setup
    assert any(line.strip().startswith("simulated needs ") for line in lines), out
    doc = replay_json(capsys, small_log, "--simulate", "1GiB", "--compare", asked, "--fit")
    row = next(r for r in doc["reports"] if r["simulated_device"])
    assert row["resource"] == "simulated" and row["setup"].endswith(stands_for)
    assert any(f["resource"] == "simulated" for f in doc["fits"])



def test_the_host_pages_line_says_what_the_supply_made_and_reused(capsys, small_log):
    """The replay's host figures come from the process's host page supply (the pinned kinds on
    a GPU take from it); on simulated memory no row takes pages, so no row has them."""
    from rrmm._cli_replay import _host_pages_line

    doc = replay_json(capsys, small_log, "--compare", "all", "--simulate", "1GiB")
    assert doc["reports"] and all(r["host_pages"] is None for r in doc["reports"])
    assert all(_host_pages_line(r) is None for r in doc["reports"])
    row = dict(doc["reports"][0], host_pages={
        "made_bytes": 3 << 30, "made_ranges": 2, "reused_takes": 5,
        "held_bytes_at_end": 3 << 30})
    line = _host_pages_line(row)  # type: ignore[arg-type]
    assert line is not None
    assert "2 range(s)" in line and "5 take(s) served by pages made before" in line
