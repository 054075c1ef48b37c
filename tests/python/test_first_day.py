"""The first day's leftovers of issue 50, each said once and as the code does: the recipe for
recording a log of one's own, the fit search and the expandable pool's pages described one way
(``--help`` and docs/api.md alike), the ``timings:`` counts in row order, a host pool's sleep
line, and where the commands write their files."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rrmm import _cli_common, _cli_replay, _rrmm, mr
from rrmm.__main__ import build_parser
from small_logs import NINE_MIB_PEAK

API_MD = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def words(text: str) -> str:
    """``text`` with its whitespace (line breaks of a wrapped paragraph) as single spaces."""
    return re.sub(r"\s+", " ", text)


def help_of(*command: str) -> str:
    parser = build_parser()
    for action in parser._actions:  # the subcommand's own parser, as `rrmm replay --help` shows
        if getattr(action, "choices", None) and command[0] in action.choices:
            sub = action.choices[command[0]]
            if len(command) > 1:
                return help_of_parser(sub, command[1:])
            return words(sub.format_help())
    raise AssertionError(command)


def help_of_parser(parser, command) -> str:
    for action in parser._actions:
        if getattr(action, "choices", None) and command[0] in action.choices:
            return words(action.choices[command[0]].format_help())
    raise AssertionError(command)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("first_day") / "nine.csv"
    path.write_text(NINE_MIB_PEAK)
    return str(path)


def test_the_fit_search_is_described_one_way():
    search = ("the search: up from the log's peak in steps of 1% of the size or 64 MiB, "
              "whichever is finer; past about twice the peak, doubling, then halving the "
              "bracket to that step")
    replay = help_of("replay")
    assert search in replay and search in words(API_MD)
    assert "binary search" not in replay and "in 1% steps" not in words(API_MD)


def test_the_expandable_pools_pages_are_told_as_the_code_makes_them(log):
    said = "32 MiB on a GPU, 2 MiB on simulated memory"
    assert said in help_of("replay")
    assert "default 32 MiB on a device, 2 MiB on simulated memory" in words(API_MD)
    assert mr.ExpandableMemoryResource(simulated_capacity="1GiB").page_size() == 2 << 20
    (row,) = _rrmm.replay_logs([log], ["expandable"], simulate="1GiB", repeat=1)
    assert "expandable pool, 2.00 MiB pages" in row["setup"], row["setup"]


def test_recording_a_log_of_ones_own_is_in_the_help_of_each_command_that_reads_one():
    recipe = words(_cli_common.RECORDING)
    assert "mylog.dev0.csv" in recipe and "inserts the device before the extension" in recipe
    for command in (("replay",), ("snapshot", "view")):
        assert recipe in help_of(*command), command


def test_the_timings_counts_follow_the_rows(log):
    rows = (_rrmm.replay_logs([log], ["pool"], simulate="1GiB", repeat=3)
            + _rrmm.replay_logs([log], ["simulated"], simulate="1GiB", repeat=1)
            + _rrmm.replay_logs([log], ["binning"], simulate="1GiB", repeat=2))
    out = io.StringIO()
    _cli_replay._print_text(rows, [], "a simulated device", {}, out)
    assert "timings: median of 3/1/2 repetition(s)" in out.getvalue(), out.getvalue()
    same = io.StringIO()
    _cli_replay._print_text(rows[:1] * 2, [], "a simulated device", {}, same)
    assert "timings: median of 3 repetition(s)" in same.getvalue()


def test_a_host_pools_sleep_line_says_host_memory(log):
    (device,) = _rrmm.replay_logs([log], ["expandable"], simulate="1GiB", repeat=1)
    (host,) = _rrmm.replay_logs([log], ["pinned_expandable"], simulate="1GiB", repeat=1)
    assert "of device memory" in _cli_replay._sleep_line(device)
    line = _cli_replay._sleep_line(host)
    assert "of pinned host memory" in line and "device memory" not in line, line


def test_the_commands_say_where_their_files_go(log, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from rrmm.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert main(["replay", log, "--simulate", "1GiB", "-q", "--repeat", "1",
                 "--plot", "here.png"]) == 0
    assert f"plot written to {tmp_path / 'here.png'}" in capsys.readouterr().out
    assert "relative to the current directory" in help_of("replay")
    assert "the command prints where it wrote it" in help_of("snapshot", "view")


def test_dir_shows_the_packages_names_not_its_imports() -> None:
    """``dir(rrmm)`` lists what a user may reach (the lazy modules too), not ``Any`` or
    ``annotations``, which the package's source imports for itself."""
    import rrmm

    names = dir(rrmm)
    assert "Any" not in names and "annotations" not in names
    for name in ("reinitialize", "DeviceBuffer", "mr", "compat", "dask", "rmm_cupy_allocator"):
        assert name in names, name
