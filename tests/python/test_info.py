"""``python -m rrmm info`` and the driver queries."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rrmm import _cli_info, _rrmm


def test_info_runs(capsys):
    assert _cli_info.run(None) == 0
    out = capsys.readouterr().out
    assert "CUDA driver" in out
    assert "devices" in out


@pytest.mark.skipif(_rrmm.driver_available(), reason="checks the no-driver report")
def test_info_without_driver(capsys):
    assert _rrmm.device_count() == 0
    assert _rrmm.driver_error()
    assert _cli_info.run(None) == 0
    assert "not available" in capsys.readouterr().out
    with pytest.raises(RuntimeError):
        _rrmm.driver_version()


def test_info_parser():
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    _cli_info.add_parser(sub)
    args = parser.parse_args(["info"])
    assert args.run is _cli_info.run


def test_info_command_line():
    import rrmm._cli_replay  # noqa: F401  (the replay command is part of every build)

    result = subprocess.run(
        [sys.executable, "-m", "rrmm", "info"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "CUDA driver" in result.stdout


@pytest.fixture()
def ledger_dir(monkeypatch):
    """An empty ledger directory (a short path: members' sockets live in it) as
    RRMM_LEDGER_DIR."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="rrmm-ledger-"))  # mode 0700
    monkeypatch.setenv("RRMM_LEDGER_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_info_says_when_no_gpu_is_shared_and_how_to_share_one(capsys, ledger_dir):
    assert _cli_info.run(None) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("shared GPUs")]
    assert line.startswith(f"shared GPUs: none in {ledger_dir}")
    assert "RRMM_SHARE_GPU=1" in line and "reinitialize(share_gpu=True)" in line


def test_info_lists_each_ledgers_processes_events_and_refused_files(capsys, ledger_dir):
    import os
    import time

    import rrmm

    mr = rrmm.mr.SimulatedMemoryResource("1GiB")
    rrmm.shared_gpu.join(mr, name="trainer\x1b[31m", soft_share="256MiB", hard_limit="512MiB")
    try:
        rrmm.shared_gpu.ask(100 << 20, mr)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the ledger's entry is written every 250 ms
            rows = rrmm.shared_gpu.read_ledgers()["simulated-1073741824"]["processes"]
            if rows and rows[0].history:
                break
            time.sleep(0.05)
        ns = os.stat("/proc/self/ns/pid").st_ino
        (ledger_dir / "simulated-1073741824" / f"99-{ns}.json").write_text("{")
        assert _cli_info.run(None) == 0
        out = capsys.readouterr().out
        # Another process reads the ledgers without joining: the command line.
        result = subprocess.run([sys.executable, "-m", "rrmm", "info"], capture_output=True,
                                text=True, check=False, env=dict(os.environ))
    finally:
        rrmm.shared_gpu.leave(mr)
    assert result.returncode == 0, result.stderr
    for text in (out, result.stdout):
        assert "\x1b" not in text, "a name from a ledger never reaches the terminal raw"
        assert f"shared GPUs: 1 ledger(s) in {ledger_dir}" in text
        assert "  simulated-1073741824: 1 process(es)" in text
        (row,) = [ln for ln in text.splitlines() if ln.startswith(f"    pid {os.getpid()} ")]
        assert "'trainer" in row
        assert "share 256.00 MiB" in row and "live 0 B" in row and "cached 0 B" in row
        assert "asleep 0 B" in row and "idle no" in row
        assert "hard limit 512.00 MiB (user)" in row
        assert "      asked: 100.00 MiB, given 0 B in " in text
        assert f"    refused 99-{ns}.json: not a ledger entry" in text
    assert "CUDA driver" in out, "the rest of the report is as before"


def test_events_and_refusals_from_other_processes_files_reach_the_terminal_escaped():
    line = _cli_info._event({"kind": "gave\x1b[2J", "peer": 42, "bytes": 3 << 20, "given": 1 << 20,
                             "seconds": 0.0125, "note": "trim\nnext"})
    assert line == "gave\\x1b[2J, peer 42: 3.00 MiB, given 1.00 MiB in 12.5 ms (trim\\nnext)"
    assert _cli_info._event({}) == "?: 0 B, given 0 B in 0.0 ms"
    assert len(_cli_info._printable("x" * 1000)) == 200
