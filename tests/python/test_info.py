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
