"""Messages that name what was wrong with the value given (issue 39), each class generated: sizes
past 2**64 - 1 (too large, not unparsable), exceptions without a message of their own, paths
that are not files (``rrmm snapshot view /dev/zero`` said "error: error"), a snapshot's
``rrmm.sleep`` figures of any JSON value (Infinity, null, lists and strings gave a traceback or
negative figures), every argument of ``HostBuffer``, and each ``--fit`` line's "fails on"
against a replay on that size (managed memory said "fails on 1.25 GiB" beside "failed 0")."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import rrmm
from conftest import JSON_VALUES
from hypothesis import given, settings
from hypothesis import strategies as st
from rrmm import _rrmm, mr
from rrmm.__main__ import main
from rrmm._cli_common import error_text
from rrmm._cli_replay import parse_size
from rrmm._snapshot_view import SLEEP_FIGURES, render_html

LARGEST = (1 << 64) - 1
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
         "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------ sizes past 2**64 - 1


@st.composite
def sizes_past_the_largest(draw: st.DrawFn) -> str:
    unit = draw(st.sampled_from(sorted(UNITS)))
    number = draw(st.integers(LARGEST // UNITS[unit] + 1, 10**40))
    space = draw(st.sampled_from(["", " ", "\t"])) if unit else ""
    fraction = draw(st.sampled_from(["", ".5", ".0"]))
    return f"{number}{fraction}{space}{unit}"


@settings(max_examples=200, deadline=None)
@given(text=sizes_past_the_largest())
def test_a_size_past_the_largest_is_too_large_naming_the_largest(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_size(text)
    message = str(refused.value)
    assert "too large" in message and str(LARGEST) in message, message
    assert "Could not parse" not in message


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="0123456789.kmgtpiKMGTPIbB \tx-e", max_size=12))
def test_a_size_the_parser_refuses_is_called_too_large_only_when_it_is(text):
    import argparse

    try:
        value = parse_size(text)
    except argparse.ArgumentTypeError as refused:
        grammatical = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)[\t ]*((?i:(?:[kmgtp]i?)?b))?", text)
        assert ("too large" in str(refused)) == bool(grammatical), (text, str(refused))
    else:
        assert 0 <= value <= LARGEST


@settings(max_examples=100, deadline=None)
@given(extra=st.integers(1, 10**30), unit=st.sampled_from(["", "B", "KiB", "MB", "PiB", "pb"]))
def test_parse_bytes_says_a_size_past_the_largest_is_too_large(extra, unit):
    with pytest.raises(ValueError, match="too large: the largest size is"):
        rrmm.parse_bytes(f"{LARGEST + extra}{unit}")
    with pytest.raises(ValueError, match="Could not parse"):
        rrmm.parse_bytes(f"{extra}x{unit}")


# ------------------------------------------------------------------ exceptions without words


EXCEPTIONS = [t for t in vars(builtins).values() if isinstance(t, type)
              and issubclass(t, Exception) and not issubclass(t, BaseExceptionGroup)]


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(EXCEPTIONS), words=st.sampled_from(["", " ", "\n", "\n\n x \ny"]))
def test_an_error_without_words_is_described_never_a_bare_error(kind, words):
    try:
        error = kind(words)
    except TypeError:  # an exception that takes other arguments (UnicodeDecodeError)
        error = kind.__new__(kind)
    text = error_text(error)
    assert text.strip() and "\n" not in text and text.lower() not in ("error", "")
    if isinstance(error, MemoryError) and not str(error).strip():
        assert text == "out of memory"


# ------------------------------------------------------------------ paths that are not files


def _fifo(folder: Path) -> str:
    path = folder / "pipe"
    os.mkfifo(path)
    return str(path)


def _socket(folder: Path) -> str:
    path = folder / "socket"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()
    return str(path)


#: A maker of each kind of path that is not a regular file (``_snapshot_view._NOT_FILES``).
NOT_FILES = {
    "a directory": lambda folder: str(folder),
    "a character device (/dev/zero)": lambda folder: "/dev/zero",
    "a character device (/dev/urandom)": lambda folder: "/dev/urandom",
    "a character device (/dev/null)": lambda folder: "/dev/null",
    "a named pipe": _fifo,
    "a socket": _socket,
}


@pytest.mark.skipif(sys.platform != "linux", reason="devices and FIFOs: Linux")
@pytest.mark.parametrize("kind", sorted(NOT_FILES))
def test_a_path_that_is_not_a_file_is_named_as_what_it_is(kind, tmp_path):
    path = NOT_FILES[kind](tmp_path)
    proc = subprocess.run([sys.executable, "-m", "rrmm", "snapshot", "view", path, "-o",
                           str(tmp_path / "page.html")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2, proc
    (line,) = proc.stderr.strip().splitlines()
    words = kind.split(" (")[0]
    assert line == f"rrmm snapshot view: error: {path}: {words}" + line.split(words, 1)[1]
    assert line.endswith(", not a snapshot or log file") or "save what it carries" in line


def test_the_kinds_of_paths_named_are_every_kind_the_viewer_refuses():
    from rrmm._snapshot_view import _NOT_FILES

    named = {words.split(" (")[0] for _, words in _NOT_FILES}
    made = {kind.split(" (")[0] for kind in NOT_FILES}
    assert named - made == {"a block device"}  # none a test may open


# ------------------------------------------------------------------ rrmm.sleep figures



def _is_size(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return False
    return 0 <= value < 1 << 64


@settings(max_examples=300, deadline=None)
@given(figure=st.sampled_from(SLEEP_FIGURES), value=JSON_VALUES)
def test_a_sleep_figure_of_any_json_value_is_shown_or_named(figure, value, tmp_path_factory):
    sleep = {name: 0 for name in SLEEP_FIGURES} | {figure: value}
    folder = tmp_path_factory.mktemp("sleep")
    path = folder / "snap.json"
    path.write_text(json.dumps({"segments": [], "device_traces": [[]], "rrmm": {"sleep": sleep}}))
    code, _, err = cli("snapshot", "view", str(path), "-o", str(folder / "p.html"))
    assert "Traceback" not in err
    if _is_size(value):
        assert code == 0, err
        page = (folder / "p.html").read_text()
        assert "a sleep would free" in page and "-" not in page.split("a sleep would free")[1][:80]
        return
    assert code == 2, (value, err)
    (line,) = err.strip().splitlines()
    assert f"rrmm.sleep.{figure} is " in line, line


@settings(max_examples=100, deadline=None)
@given(sleep=JSON_VALUES, extra=st.one_of(st.none(), JSON_VALUES))
def test_the_sleep_and_rrmm_parts_of_any_shape_are_shown_or_named(sleep, extra):
    rrmm_part = {"sleep": sleep} if extra is None else extra
    try:
        page = render_html({"segments": [], "device_traces": [[]], "rrmm": rrmm_part})
    except ValueError as refused:
        assert re.match(r"rrmm(\.sleep(\.\w+)?)? is ", str(refused)), str(refused)
    else:
        assert "NaN" not in page and "inf " not in page


# ------------------------------------------------------------------ HostBuffer's arguments


@pytest.fixture(scope="module")
def host_mr():
    return mr.SystemMemoryResource()


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), -1), st.integers(0, 4096),
    st.integers(1 << 64, 1 << 70), st.floats(), st.text(max_size=5), st.binary(max_size=5),
    st.lists(st.integers(0, 9), max_size=2), st.dictionaries(st.text(max_size=2),
                                                             st.integers(), max_size=2),
    st.builds(object), st.just(mr.SimulatedMemoryResource(1 << 20)),
    st.integers(0, 4096).map(lambda n: __import__("numpy").int64(n)),
)


def _names_the_value(error: BaseException, argument: str, value: object) -> None:
    message = str(error)
    assert isinstance(error, (TypeError, ValueError)), (type(error), message)
    assert argument in message, (argument, message)
    assert type(value).__name__ in message or str(value) in message, (value, message)


@settings(max_examples=200, deadline=None)
@given(value=ANY_VALUE)
def test_host_buffer_size_of_any_value(value, host_mr):
    try:
        hb = rrmm.HostBuffer(value, mr=host_mr)
    except (TypeError, ValueError) as error:
        _names_the_value(error, "size", value)
    else:
        assert hb.size == int(value)


@settings(max_examples=200, deadline=None)
@given(value=ANY_VALUE)
def test_host_buffer_mr_of_any_value(value):
    try:
        hb = rrmm.HostBuffer(8, mr=value)
    except (TypeError, ValueError) as error:
        _names_the_value(error, "mr", value)
    else:
        assert value is None and hb.size == 8


@settings(max_examples=200, deadline=None)
@given(value=ANY_VALUE, to_device=st.booleans())
def test_host_buffer_copy_buf_of_any_value(value, to_device, host_mr):
    hb = rrmm.HostBuffer(8, mr=host_mr)
    copy = hb.copy_to_device if to_device else hb.copy_from_device
    with pytest.raises((TypeError, ValueError)) as refused:
        copy(value)
    _names_the_value(refused.value, "buf", value)


@settings(max_examples=200, deadline=None)
@given(value=ANY_VALUE)
def test_host_buffer_copy_stream_of_any_value(value, host_mr):
    hb = rrmm.HostBuffer(8, mr=host_mr)
    db = rrmm.DeviceBuffer(size=4, mr=host_mr)
    try:
        hb.copy_from_device(db, stream=value)
    except (TypeError, ValueError) as error:
        _names_the_value(error, "stream", value)


# ------------------------------------------------------------------ --fit's "fails on"

FIT_LOG = """Thread,Time,Action,Pointer,Size,Stream
1,t,allocate,0x1000,1048576,0
1,t,allocate,0x2000,3145728,0
1,t,free,0x1000,1048576,0
1,t,allocate,0x3000,5242880,0
1,t,allocate,0x4000,7340032,0
1,t,free,0x2000,3145728,0
1,t,free,0x3000,5242880,0
1,t,free,0x4000,7340032,0
"""

#: What each wording of a fit line says of a replay on the size it names.
CLAIMS = {
    # Allocations fail, or the resource cannot even be built there (a pool's first chunk).
    "fails on": lambda r: r["error"] is not None or r["failed_allocations"] > 0,
    "some bytes go beyond the device": lambda r: (r["peak_beyond_device"] or 0) > 0,
    "some bytes reach host memory": lambda r: (r["tiers"] or [{"peak_bytes": 0}])[-1][
        "peak_bytes"] > 0,
}


@pytest.mark.skipif(_rrmm.replay_gpu_available(), reason="a GPU: --fit of the GPU's rows")
@pytest.mark.parametrize("resource", [n for n in _rrmm.replay_resource_names()
                                      if n not in ("cuda", "cuda_async", "pinned")])
def test_each_fit_line_says_what_a_replay_on_its_size_shows(resource, tmp_path):
    log = tmp_path / "fit.csv"
    log.write_text(FIT_LOG)
    common = [str(log), "--resource", resource, "--repeat", "1"]
    code, out, err = cli("replay", *common, "--simulate", "1GiB", "--fit")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith(f"    {resource} "))
    code, doc, err = cli("replay", *common, "--simulate", "1GiB", "--fit", "--json")
    (fit,) = json.loads(doc)["fits"]
    if fit["device_bytes"] is None:
        assert "fits on no device" in line
        return
    (claim,) = [c for c in CLAIMS if f"({c} " in line or line.endswith(f" {c})")]

    def replay_on(size: int) -> dict:
        code, doc, err = cli("replay", *common, "--simulate", str(size), "--json")
        assert code == 0, err
        return json.loads(doc)["reports"][0]

    assert CLAIMS[claim](replay_on(fit["failing_bytes"])), (line, claim)
    fitting = replay_on(fit["device_bytes"])
    assert fitting["error"] is None and not any(holds(fitting) for holds in CLAIMS.values()), (
        line, fitting)
