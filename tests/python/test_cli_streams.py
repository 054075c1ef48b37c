"""Every output path of the command line against every kind of stream (issue 39): each command
``rrmm --help`` lists (and each one's ``--help``, and ``--version``) runs as a child process
with standard output closed, a broken pipe, a full disk, and with standard error closed,
broken or full while the progress bar is forced on. The policy (``rrmm --help``'s exit status
section, ``rrmm._cli_common.run_with_output``): never a traceback; standard output closed or
not writable is one line on standard error and status 1; a reader that went away ends the
output quietly with the command's own status; standard error that cannot be written is
skipped and the work goes on."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rrmm.__main__ import build_parser
from small_logs import NINE_MIB_PEAK

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/dev/full and fds: Linux")

LOG = NINE_MIB_PEAK

#: A run of each command the parser holds (its words, then its arguments): {log} and {page}
#: are filled in. A command added to ``rrmm`` without a run here fails
#: ``test_every_command_has_a_run``.
RUNS: dict[tuple[str, ...], list[str]] = {
    ("info",): [],
    ("replay",): ["{log}", "--simulate", "64MiB", "--compare", "pool,binning", "--repeat", "1",
                  "--fit"],
    ("snapshot", "view"): ["{log}", "-o", "{page}"],
}

#: More output paths of the same commands: another writer (JSON) and the help of each.
EXTRA_RUNS: list[list[str]] = [
    ["replay", "{log}", "--simulate", "64MiB", "--repeat", "1", "--json"],
    ["--version"],
]


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], bool]]:
    """Every command of ``parser`` as (its words, whether it is a leaf that does the work),
    groups (``snapshot``) included, found from the parser itself."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield words, not groups
    for group in groups:
        for name, sub in group.choices.items():
            yield from commands(sub, (*words, name))


def all_runs() -> list[list[str]]:
    helps = [[*words, "--help"] for words, _ in commands(build_parser())]
    return [[*words, *args] for words, args in RUNS.items()] + EXTRA_RUNS + helps


def test_every_command_has_a_run() -> None:
    leaves = {words for words, leaf in commands(build_parser()) if leaf and words}
    assert leaves == set(RUNS), "give every rrmm command a run in RUNS"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("streams")
    log = folder / "small.csv"
    log.write_text(LOG)
    return {"log": str(log), "page": str(folder / "page.html")}


@dataclass
class Result:
    code: int
    out: str
    err: str


def rrmm(argv: list[str], *, stdout: str = "pipe", stderr: str = "pipe",
         progress: bool = False) -> Result:
    """Runs ``python -m rrmm ARGV`` with each stream ``pipe`` (read back), ``closed`` (the
    descriptor closed, as ``>&-``), ``broken`` (a pipe whose reader is gone) or ``full``
    (/dev/full); ``progress`` forces the bar on (``RRMM_PROGRESS=1``)."""
    env = {**os.environ, "RRMM_PROGRESS": "1" if progress else "0"}
    closes = [n for n, how in ((1, stdout), (2, stderr)) if how == "closed"]
    redirects = " ".join(f"{n}>&-" for n in closes)
    command = [sys.executable, "-m", "rrmm", *argv]
    if redirects:
        command = ["sh", "-c", f'exec "$@" {redirects}', "sh", *command]
    opened: list[int] = []

    def stream(how: str) -> int | None:
        if how == "broken":
            read, write = os.pipe()
            os.close(read)
            opened.append(write)
            return write
        if how == "full":
            fd = os.open("/dev/full", os.O_WRONLY)
            opened.append(fd)
            return fd
        return subprocess.PIPE if how == "pipe" else None

    try:
        proc = subprocess.run(command, stdout=stream(stdout), stderr=stream(stderr), env=env,
                              timeout=120, check=False)
    finally:
        for fd in opened:
            os.close(fd)
    return Result(proc.returncode, _text(proc.stdout), _text(proc.stderr))


def _text(output: bytes | None) -> str:
    return (output or b"").decode(errors="replace")


def fill(argv: list[str], files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in argv]


def shape(text: str) -> list[str]:
    """The output's lines by their first word, numbers blanked: what does not change between
    runs (timings do)."""
    return [re.sub(r"[0-9.]+", "N", (line.split() or [""])[0]) for line in text.splitlines()]


_EXPECTED: dict[tuple[str, ...], Result] = {}


def expected(argv: list[str]) -> Result:
    """The run of ``argv`` with both streams read back, what the tests of a reader gone away and
    of standard error compare their runs with: the same run for the four of them, so made once
    (per pytest worker), not four times (3 of the 10 child processes of each run)."""
    key = tuple(argv)
    if key not in _EXPECTED:
        _EXPECTED[key] = rrmm(argv)
    return _EXPECTED[key]


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.err + result.out, result.err


RUN_IDS = [" ".join(a for a in argv if not a.startswith("{")) for argv in all_runs()]


@pytest.mark.parametrize("argv", all_runs(), ids=RUN_IDS)
def test_standard_output_closed_is_one_line_and_status_1(argv, files):
    result = rrmm(fill(argv, files), stdout="closed")
    no_traceback(result)
    assert result.code == 1, result
    (line,) = result.err.strip().splitlines()
    assert line.startswith("rrmm: error: standard output is closed"), line


@pytest.mark.parametrize("argv", all_runs(), ids=RUN_IDS)
def test_a_reader_that_went_away_ends_the_output_quietly(argv, files):
    result = rrmm(fill(argv, files), stdout="broken")
    no_traceback(result)
    assert (result.code, result.err) == (expected(fill(argv, files)).code, ""), result


@pytest.mark.parametrize("argv", all_runs(), ids=RUN_IDS)
def test_a_full_disk_is_one_line_and_status_1(argv, files):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    result = rrmm(fill(argv, files), stdout="full")
    no_traceback(result)
    assert result.code == 1, result
    (line,) = result.err.strip().splitlines()
    assert line == "rrmm: error: cannot write to standard output: No space left on device"


@pytest.mark.parametrize("how", ["closed", "broken", "full"])
@pytest.mark.parametrize("argv", all_runs(), ids=RUN_IDS)
def test_standard_error_that_cannot_be_written_skips_progress_and_the_work_goes_on(
        argv, how, files):
    if how == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    want = expected(fill(argv, files))
    result = rrmm(fill(argv, files), stderr=how, progress=True)
    assert result.code == want.code == 0, (want, result)
    assert shape(result.out) == shape(want.out) and result.out.endswith("\n"), result.out


@pytest.mark.parametrize("words", [words for words, _ in commands(build_parser())],
                         ids=lambda words: " ".join(words) or "rrmm")
def test_a_usage_error_with_standard_error_closed_prints_nothing_on_standard_output(words):
    # print(file=sys.stderr) with sys.stderr None writes to standard output: never here.
    result = rrmm([*words, "--no-such-option"], stderr="closed")
    assert result.code == 2 and result.out == "", result


def test_the_page_is_written_though_its_reader_went_away(files):
    page = Path(files["page"])
    page.unlink(missing_ok=True)
    result = rrmm(["snapshot", "view", files["log"], "-o", str(page)], stdout="broken")
    assert result.code == 0 and page.stat().st_size > 0, result


def test_a_progress_bar_on_a_stream_closed_at_start_is_not_drawn():
    # In a library (snapshot_from_log): standard error None, the bar forced on.
    from rrmm._progress import Progress, progress_wanted

    saved = sys.stderr
    sys.stderr = None  # type: ignore[assignment]
    try:
        assert not progress_wanted()
        with Progress("x", 2, enabled=True) as bar:
            bar.step("a")
            assert not bar.enabled
    finally:
        sys.stderr = saved
