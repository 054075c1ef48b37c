"""rrmm.record_memory_history: allocations and frees through DeviceBuffer (and the hooks) with
their Python stacks, in PyTorch's trace layout inside memory_snapshot(), drawn by
`rrmm snapshot view` as a self-contained page; and, where a Chromium is installed, that page
rendered in a real browser. On simulated memory, so it runs anywhere."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess

import pytest
import rrmm
from rrmm import _rrmm, mr
from rrmm.__main__ import main

MiB = 1 << 20


@pytest.fixture
def recorded_pool():
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(1024 * MiB),
                                 initial_pool_size=256 * MiB)
    mr.set_per_device_resource(0, pool)
    rrmm.record_memory_history("all", max_entries=1000)
    yield pool
    rrmm.record_memory_history(None)
    _rrmm._clear_per_device_resources()


def make_buffers_in_a_named_function(n: int) -> list[rrmm.DeviceBuffer]:
    return [rrmm.DeviceBuffer(size=(i + 1) * MiB) for i in range(n)]


def test_history_carries_allocations_frees_and_stacks(recorded_pool):
    bufs = make_buffers_in_a_named_function(4)
    del bufs[1]
    trace = rrmm.memory_snapshot(0)["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc"] * 4 + ["free_completed"]
    assert [e["size"] for e in trace] == [MiB, 2 * MiB, 3 * MiB, 4 * MiB, 2 * MiB]
    assert trace[4]["addr"] == trace[1]["addr"]
    names = [f["name"] for f in trace[0]["frames"]]
    assert "make_buffers_in_a_named_function" in names
    assert trace[0]["frames"][0]["filename"].endswith("test_memory_history.py")
    assert all(e["time_us"] > 0 for e in trace)


def test_the_ring_keeps_the_newest_and_off_records_nothing(recorded_pool):
    rrmm.record_memory_history("all", max_entries=3, stacks=None)
    bufs = make_buffers_in_a_named_function(5)
    trace = rrmm.memory_snapshot(0)["device_traces"][0]
    assert [e["size"] for e in trace] == [3 * MiB, 4 * MiB, 5 * MiB]
    assert all(e["frames"] == [] for e in trace)
    rrmm.record_memory_history(None)
    del bufs
    assert rrmm.memory_snapshot(0)["device_traces"][0] == []
    for bad in ({"enabled": "sometimes"}, {"stacks": "c++"}, {"max_entries": 0}):
        with pytest.raises(ValueError):
            rrmm.record_memory_history(**bad)


def test_the_html_view_draws_the_recorded_timeline(recorded_pool, tmp_path):
    bufs = make_buffers_in_a_named_function(6)
    del bufs[::2]
    snap = tmp_path / "snap.pickle"
    with open(snap, "wb") as f:
        pickle.dump(rrmm.memory_snapshot(0), f)
    page = tmp_path / "snap.html"
    assert main(["snapshot", "view", str(snap), "-o", str(page)]) == 0
    html = page.read_text()
    assert "<svg" in html and "http://" not in html.replace("http://www.w3.org", "")
    assert "make_buffers_in_a_named_function" in html
    # Debian's chromium-headless-shell package (issue 31) and the usual browser names.
    browser = next((path for path in map(shutil.which, (
        "chromium-headless-shell", "chromium", "chromium-browser", "google-chrome",
        "headless_shell")) if path), None)
    if browser is None and os.access("/usr/lib/chromium/headless_shell", os.X_OK):
        browser = "/usr/lib/chromium/headless_shell"
    if browser is None:
        pytest.skip("no Chromium on this machine to render the page")
    shot = tmp_path / "snap.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000  # a drawn page, not a blank one
