"""Progress of long command-line work (issue 31): a bar on standard error while it is a
terminal, nothing when it is not, nothing with ``--quiet``. The terminal is a real
pseudo-terminal (``pty``): the command runs in a child process whose standard error is one."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time

import pytest
from rrmm._progress import Progress, progress_wanted

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals: Linux")


def run_on_a_terminal(*argv: str, timeout: float = 120.0) -> tuple[int, str, str]:
    """Runs ``python -m rrmm ARGV`` with standard error on a pseudo-terminal; returns (status,
    standard output, what the terminal showed)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "RRMM_PROGRESS"}
    child = subprocess.Popen([sys.executable, "-m", "rrmm", *argv], stdout=subprocess.PIPE,
                             stderr=slave, env=env)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            shown += chunk
        elif child.poll() is not None:
            break
    os.close(master)
    out = child.stdout.read() if child.stdout else b""
    code = child.wait(timeout=timeout)
    return code, out.decode(), shown.decode(errors="replace")


COMPARE = ("replay", "random_10k_1mib", "--compare", "pool,binning,arena", "--simulate", "4GiB",
           "--repeat", "1", "--fit")


def test_replay_compare_and_fit_draw_a_bar_on_a_terminal():
    code, out, terminal = run_on_a_terminal(*COMPARE)
    assert code == 0, terminal
    # One step per (log, resource) for the replays and again for the fits, redrawn in place.
    assert "rrmm replay [" in terminal, terminal
    for step in ("replay pool on random_10k_1mib", "replay arena on random_10k_1mib",
                 "fit binning on random_10k_1mib"):
        assert step in terminal, terminal
    assert "/6" in terminal
    assert "\r" in terminal and terminal.rstrip().endswith("\x1b[K"), "the bar clears its line"
    # The report itself is on standard output, untouched by the bar.
    assert "rrmm replay [" not in out and "pool needs" in out


def test_quiet_and_a_pipe_show_no_bar():
    code, _, terminal = run_on_a_terminal(*COMPARE, "--quiet")
    assert code == 0
    assert "rrmm replay [" not in terminal and terminal.strip() == "", terminal
    piped = subprocess.run([sys.executable, "-m", "rrmm", *COMPARE], capture_output=True,
                           text=True, env={k: v for k, v in os.environ.items()
                                           if k != "RRMM_PROGRESS"}, check=False)
    assert piped.returncode == 0
    assert "rrmm replay [" not in piped.stderr and "\r" not in piped.stderr


def test_the_viewer_draws_a_bar_while_a_large_log_replays(tmp_path):
    page = tmp_path / "page.html"
    code, _, terminal = run_on_a_terminal("snapshot", "view", "random_10k_1mib", "-o", str(page))
    assert code == 0 and page.exists(), terminal
    assert "rrmm snapshot view: replaying the log [" in terminal, terminal
    code, _, terminal = run_on_a_terminal("snapshot", "view", "random_10k_1mib", "-o",
                                          str(page), "-q")
    assert code == 0 and "[" not in terminal, terminal


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_counts_steps_and_clears_its_line(monkeypatch):
    monkeypatch.delenv("RRMM_PROGRESS", raising=False)
    stream = FakeTerminal()
    with Progress("work", 3, stream=stream) as bar:
        assert bar.enabled
        for name in ("a", "b", "c"):
            bar.step(name)
        assert bar.done == 2 and bar.line().startswith("work [") and " 2/3 c " in bar.line()
    text = stream.getvalue()
    assert "work [" in text and text.endswith("\r\x1b[K")
    assert progress_wanted(FakeTerminal(), quiet=True) is False
    assert progress_wanted(io.StringIO()) is False
    monkeypatch.setenv("RRMM_PROGRESS", "1")
    assert progress_wanted(io.StringIO()) is True
    monkeypatch.setenv("RRMM_PROGRESS", "0")
    assert progress_wanted(FakeTerminal()) is False
    quiet = io.StringIO()
    with Progress("work", 2, stream=quiet) as bar:
        bar.step("a")
    assert quiet.getvalue() == ""


def test_a_large_pinned_pool_says_so_on_a_terminal(monkeypatch, capsys):
    from rrmm import _rrmm
    from rrmm.rmm import PINNED_NOTICE_BYTES, _pinned_pool

    if not _rrmm.driver_available() or _rrmm.device_count() == 0:
        pytest.skip("pinned host memory needs a CUDA driver and a device")
    monkeypatch.setenv("RRMM_PROGRESS", "1")  # standard error is captured: force the terminal
    pool = _pinned_pool(PINNED_NOTICE_BYTES)
    err = capsys.readouterr().err
    assert "making a pinned pool of 4.00 GiB" in err and err.endswith("\r\x1b[K")
    assert pool.pool_size() >= PINNED_NOTICE_BYTES
    del pool
    _pinned_pool(1 << 20)
    assert capsys.readouterr().err == ""


def test_the_engine_reports_progress_to_the_one_bar_and_prints_nothing(capfd) -> None:
    """Issue 36: one progress printer, outside the replay engine. A long replay (timed
    repetitions past a second) calls the caller's function with (events done, events in all,
    seconds, repetitions) and writes nothing itself; the command line's bar shows it."""
    from rrmm import _rrmm
    from rrmm._cli_common import resolve_log
    from rrmm._cli_replay import _replay_detail
    from rrmm._progress import Progress

    calls: list[tuple[int, int, float, int]] = []
    path, _ = resolve_log("random_100k_4mib")
    # Timed repetitions for two seconds at least (progress starts after one): as many as the
    # fastest of three takes, not a fixed 250 (6 s on the 2-core machine).
    (probe,) = _rrmm.replay_logs([path], ["pool"], simulate=32 << 30, repeat=3)
    repeat = 2_000_000_000 // min(probe["samples_ns"]) + 1
    (row,) = _rrmm.replay_logs([path], ["pool"], simulate=32 << 30, repeat=repeat,
                               progress=lambda *a: calls.append(a))
    assert row["error"] is None
    assert calls and all(done == total for done, total, _, _ in calls)
    assert [r for *_, r in calls] == sorted(r for *_, r in calls) and calls[-1][3] >= 1
    assert capfd.readouterr().err == "", "the engine prints nothing"
    bar = Progress("rrmm replay", 1, enabled=False)
    bar.step("replay pool")
    _replay_detail(bar)(10, 100, 0.5, 0)
    assert "10.0% of 100 events" in bar.line()
    _replay_detail(bar)(100, 100, 2.0, 7)
    assert "7 timed repetition(s)" in bar.line()


def test_a_fit_moves_the_bar_with_every_size_it_tries(capfd) -> None:
    """Issue 39: `--fit` of expandable took seconds with the bar standing still. The fit calls
    the caller's function after every size its search tried (tries, the size, whether it
    fitted); the bar shows it; the engine writes nothing."""
    from rrmm import _rrmm
    from rrmm._cli_common import resolve_log
    from rrmm._cli_replay import _fit_detail
    from rrmm._progress import Progress

    calls: list[tuple[int, int, bool]] = []
    path, _ = resolve_log("transformer_training")
    (fit,) = _rrmm.fit_logs([path], ["pool"], progress=lambda *a: calls.append(a))
    assert fit["device_bytes"] is not None
    assert [t for t, _, _ in calls] == list(range(1, len(calls) + 1))
    assert len(calls) == fit["replays"]
    assert any(ok for *_, ok in calls), "the size it found was tried and fitted"
    assert min(size for size, ok in ((s, ok) for _, s, ok in calls) if ok) == fit["device_bytes"]
    assert capfd.readouterr().err == ""
    bar = Progress("rrmm replay", 1, enabled=False)
    bar.step("fit pool")
    _fit_detail(bar)(3, 3 << 30, False)
    assert "try 3: 3.00 GiB does not fit" in bar.line()
    with pytest.raises(ZeroDivisionError):
        _rrmm.fit_logs([path], ["pool"], progress=lambda *a: 1 / 0)
