"""The shared GPU's ledger in memory snapshots (``rrmm.memory_snapshot()["rrmm"]["shared_gpu"]``)
and in ``rrmm snapshot view``'s page ("Processes on this GPU"), on a simulated device.

What is checked: a process that joined its GPU's ledger carries the ledger's processes and its
own history in its snapshot (plain data: JSON and pickle); the page shows a row per process and
what was asked and given; a snapshot without the section renders as before; a malformed section
is a one-line error naming the field, never a traceback or a made-up figure on the page.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rrmm
from conftest import JSON_VALUES
from conftest import snapshot_view as view
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rrmm import _rrmm
from rrmm._snapshot_view import render_html

MIB = 1 << 20


@pytest.fixture()
def ledger() -> Iterator[Path]:
    """A ledger directory with a short path (a member's socket path must fit 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="rrmm-ledger-"))  # mode 0700
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_snapshot_carries_the_ledger_where_this_process_joined(ledger: Path) -> None:
    pool = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource("1GiB"),
                                      initial_pool_size=0)
    rrmm.mr.set_current_device_resource(pool)
    try:
        assert rrmm.memory_snapshot()["rrmm"]["shared_gpu"] is None, "not joined: None"
        rrmm.shared_gpu.join(pool, directory=ledger, name="snapper", soft_share="128MiB")
        kept = rrmm.DeviceBuffer(size=8 * MIB)
        rrmm.shared_gpu.ask(100 * MIB, pool)
        snap = rrmm.memory_snapshot()
        section = snap["rrmm"]["shared_gpu"]
        assert section["pid"] == os.getpid()
        assert section["directory"] == str(ledger / "simulated-1073741824")
        (me,) = [p for p in section["processes"] if p["pid"] == os.getpid()]
        assert me["name"] == "snapper" and me["soft_share"] == 128 * MIB
        assert {"live", "cached", "asleep", "idle"} <= set(me)
        assert section["history"][-1]["kind"] == "asked"
        assert section["history"][-1]["bytes"] == 100 * MIB
        # Plain data, as PyTorch's tools and the viewer read snapshots.
        assert pickle.loads(pickle.dumps(snap)) == snap
        path = Path(tempfile.mkdtemp(prefix="rrmm-snap-"))
        try:
            (path / "snap.json").write_text(json.dumps(snap))
            code, _, err = view(str(path / "snap.json"), "-o", str(path / "p.html"))
            assert code == 0, err
            page = (path / "p.html").read_text()
        finally:
            shutil.rmtree(path)
        assert "<h2>Processes on this GPU</h2>" in page
        assert f"<td>{os.getpid()} (this process)</td><td>snapper</td><td>128.00 MiB</td>" in page
        assert "<td>asked</td>" in page and "<td>100.00 MiB</td>" in page
        assert "shared GPU</td><td>1 process(es) in the ledger; this one: " in page
        del kept
        rrmm.shared_gpu.leave(pool)
        assert rrmm.memory_snapshot()["rrmm"]["shared_gpu"] is None
    finally:
        rrmm.shared_gpu.leave(pool)
        _rrmm._clear_per_device_resources()


def test_a_snapshot_without_the_section_renders_as_before() -> None:
    trace = [{"action": "alloc", "addr": 4096, "size": 4096, "frames": []}]
    plain = {"segments": [], "device_traces": [trace]}
    page = render_html(plain)
    assert page == render_html({**plain, "rrmm": {"sleep": None, "shared_gpu": None}})
    assert "Processes on this GPU" not in page and "shared GPU" not in page


def test_an_empty_ledger_section_says_so() -> None:
    page = render_html({"segments": [], "device_traces": [[]],
                        "rrmm": {"shared_gpu": {"processes": [], "history": []}}})
    assert "No process in the ledger" in page and "Nothing asked or given yet" in page


# ------------------------------------------------------------------ malformed sections

GOOD_PROCESS = {"pid": 7, "name": "w", "soft_share": None, "hard_limit": 1 << 30,
                "hard_limit_from": "user", "live": 1, "cached": 2, "asleep": 3, "idle": True}
GOOD_EVENT = {"at": 1.7e9, "kind": "asked", "peer": 8, "bytes": 4096, "given": 0,
              "seconds": 0.001, "note": ""}

SIZES = ("pid", "live", "cached", "asleep", "peer", "bytes", "given")
OPTIONAL_SIZES = ("soft_share", "hard_limit")
TEXTS = ("name", "hard_limit_from", "kind", "note")
SECONDS = ("at", "seconds")


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _is_size(value: object) -> bool:
    if not _is_number(value):
        return False
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return False
    return 0 <= value < 1 << 64  # type: ignore[operator]


def _accepted(field: str, value: object) -> bool:
    """Whether the viewer takes ``value`` for ``field`` (else it names the field)."""
    if field in SIZES:
        return _is_size(value)
    if field in OPTIONAL_SIZES:
        return value is None or _is_size(value)
    if field in TEXTS:
        return value is None or isinstance(value, str)
    if field in SECONDS:
        return _is_number(value) and math.isfinite(value) and 0 <= value < 1 << 64  # type: ignore[arg-type,operator]
    assert field == "idle"
    return isinstance(value, bool)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(GOOD_PROCESS)), value=JSON_VALUES)
def test_a_process_field_of_any_json_value_is_shown_or_named(field: str, value: Any) -> None:
    section = {"pid": 7, "processes": [GOOD_PROCESS, {**GOOD_PROCESS, field: value}],
               "history": [GOOD_EVENT]}
    _shown_or_named(section, f"rrmm.shared_gpu.processes[1].{field}", _accepted(field, value),
                    field in TEXTS)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(GOOD_EVENT)), value=JSON_VALUES)
def test_a_history_field_of_any_json_value_is_shown_or_named(field: str, value: Any) -> None:
    section = {"pid": 7, "processes": [GOOD_PROCESS],
               "history": [GOOD_EVENT, {**GOOD_EVENT, field: value}]}
    _shown_or_named(section, f"rrmm.shared_gpu.history[1].{field}", _accepted(field, value),
                    field in TEXTS)


def _shown_or_named(section: dict[str, Any], where: str, accepted: bool, text: bool) -> None:
    # Through JSON, as a saved snapshot is read (NaN and Infinity included).
    snapshot = json.loads(json.dumps({"segments": [], "device_traces": [[]],
                                      "rrmm": {"shared_gpu": section}}))
    try:
        page = render_html(snapshot)
    except ValueError as refused:
        assert not accepted, refused
        (line,) = str(refused).splitlines()
        assert line.startswith(f"{where} is "), line
    else:
        assert accepted, f"{where} was shown"
        assert "Processes on this GPU" in page
        if not text:  # a text field may say anything; a figure is never made up
            assert "NaN" not in page and "inf " not in page and "-1 " not in page


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(section=st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({}, optional={"pid": JSON_VALUES, "directory": JSON_VALUES,
                                        "processes": JSON_VALUES, "history": JSON_VALUES}),
))
def test_a_section_of_any_shape_is_a_page_or_one_line_naming_the_field(
    tmp_path: Path, section: Any
) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps({"segments": [], "device_traces": [[]],
                                "rrmm": {"shared_gpu": section}}))
    code, out, err = view(str(path), "-o", str(tmp_path / "p.html"))
    assert "Traceback" not in out + err
    if code == 0:
        assert err == ""
        return
    assert code == 2, (code, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("rrmm snapshot view: error: ") and "rrmm.shared_gpu" in line, line
