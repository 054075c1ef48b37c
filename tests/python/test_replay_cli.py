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

def _traces_dir() -> Path:
    """The shared traces: $RRMM_TRACES, else shared/traces beside the checkout."""
    if "RRMM_TRACES" in os.environ:
        return Path(os.environ["RRMM_TRACES"])
    return Path(__file__).resolve().parents[2].parent / "shared" / "traces"


TRACES = _traces_dir()


def replay(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def replay_json(capsys, *args: str) -> dict:
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


def test_parse_size():
    assert parse_size("4GiB") == 4 << 30
    assert parse_size("512 MiB") == 512 << 20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("4G") == 4 << 30
    assert parse_size("1000") == 1000
    for bad in ["", "GiB", "4XB", "-1GiB", "1e400"]:
        with pytest.raises(argparse.ArgumentTypeError):
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
    assert "timeline" not in r


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
        capsys, small_log, "--simulate", "1GiB", "--compare", "pool,binning,fixed_size,simulated"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{small_log}: 7 events, 2 thread(s), 2 stream(s)")
    assert "the log records 1 failed allocation(s)" in out
    header = next(line for line in lines if line.startswith("resource"))
    columns = ["events", "ns/event", "peak in use", "peak footprint", "frag@peak", "frag@end"]
    for column in columns + ["failed", "leaks"]:
        assert column in header
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in
            {"pool", "binning", "fixed_size", "simulated"}}
    assert set(rows) == {"pool", "binning", "fixed_size", "simulated"}
    for row in rows.values():
        assert " 7 " in row
        assert "1 (500 B)" in row  # the leak


def test_compare_all_and_json_of_several_logs(capsys, tmp_path, small_log):
    other = tmp_path / "other.csv"
    other.write_text(HEADER + "\n1,t,allocate,0x10,100,0\n1,t,free,0x10,100,0\n")
    doc = replay_json(capsys, small_log, str(other), "--simulate", "1GiB", "--compare", "all")
    pairs = [(r["log"], r["resource"]) for r in doc["reports"]]
    names = ["pool", "binning", "arena", "fixed_size", "simulated"]
    assert pairs == [(small_log, n) for n in names] + [(str(other), n) for n in names]
    assert all(r["peak_bytes_in_use"] == 100 for r in doc["reports"][len(names) :])


def test_shared_traces_figures(capsys):
    # From an independent pass over the CSV: (events, allocations, peak bytes in use, leaks,
    # leaked bytes, threads).
    expected = {
        "random_10k_1mib": (20_000, 10_000, 3_309_099_223, 0, 0, 1),
        "transformer_training": (21_949, 11_046, 1_313_089_416, 105, 234_633_728, 2),
    }
    for name, (events, allocs, peak, leaks, leaked_bytes, threads) in expected.items():
        path = TRACES / f"{name}.csv.gz"
        if not path.exists():
            pytest.skip(f"{path} not found")
        doc = replay_json(capsys, str(path), "--simulate", "64GiB", "--compare", "pool,binning")
        for r in doc["reports"]:
            assert r["events"] == events
            assert r["allocations"] == allocs
            assert r["peak_bytes_in_use"] == peak
            assert (r["leaked_allocations"], r["leaked_bytes"]) == (leaks, leaked_bytes)
            assert r["failed_allocations"] == 0
            assert r["threads"] == threads
            assert r["peak_footprint"] >= peak


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
    assert "pip install rrmm[plot]" in err
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
    assert code == 2
    code, _, err = replay(capsys, small_log, "--simulate", "0")
    assert code == 2 and "positive" in err
    code, _, err = replay(capsys, small_log, "--simulate", "1GiB", "--initial-pool-size", "1000")
    assert code == 2 and "256" in err  # RMM's pool size validation
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", small_log, "--simulate", "4XB"])
    assert exit_info.value.code == 2
    capsys.readouterr()


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
    code, out, err = replay(capsys, small_log, "--json")
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
                   "--maximum-pool-size", "--plot", "--json", "--lenient"]:
        assert option in out


def test_shipped_trace_by_name_replays_like_its_file(capsys):
    from rrmm import traces

    assert "transformer_training" in traces.names()
    by_name = replay_json(capsys, "transformer_training", "--simulate", "80GiB", "--resource", "pool")
    path = str(traces.path("transformer_training"))
    by_path = replay_json(capsys, path, "--simulate", "80GiB", "--resource", "pool")
    (a,), (b,) = by_name["reports"], by_path["reports"]
    assert a["log"] == b["log"] == path
    for key in ("events", "allocations", "peak_bytes_in_use", "peak_footprint", "leaked_bytes"):
        assert a[key] == b[key], key
    assert a["events"] > 20000
    assert a["failed_allocations"] == 0


def test_unknown_name_is_reported_as_a_missing_file(capsys):
    code, _, err = replay(capsys, "no_such_trace_anywhere", "--simulate", "1GiB")
    assert code == 2
    assert "no_such_trace_anywhere" in err
