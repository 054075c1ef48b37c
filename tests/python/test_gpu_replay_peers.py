"""GPU test of ``rrmm replay --compare pool,expandable,torch,cupy``: the shipped transformer log
through rrmm (from Rust and from Python), PyTorch's caching allocator and CuPy's memory pool.
Skipped with a reason without a CUDA device, PyTorch or CuPy (each seeing the device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import skip_module_without_gpu

skip_module_without_gpu()
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)
cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
if not cupy.cuda.is_available():
    pytest.skip("no CUDA device for CuPy", allow_module_level=True)

RESOURCES = "pool,expandable,torch,cupy"
ROWS = [("pool", "rust"), ("pool", "python"), ("expandable", "rust"),
        ("expandable", "python"), ("torch", "python"), ("cupy", "python")]


def replay_json(*extra: str) -> dict:
    """``rrmm replay transformer_training --compare RESOURCES --json`` in a fresh interpreter
    (PyTorch and CuPy keep their caches for the life of a process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rrmm", "replay", "transformer_training", "--compare", RESOURCES,
         "--json", "--repeat", "3", *extra],
        capture_output=True, text=True, env=dict(os.environ), timeout=540, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_transformer_log_through_every_allocator():
    doc = replay_json()
    assert doc["memory"] == "gpu"
    rows = doc["reports"]
    assert [(r["resource"], r["driver"]) for r in rows] == ROWS
    for r in rows:
        name = f"{r['resource']} ({r['driver']})"
        assert r["error"] is None, (name, r["error"])
        assert r["failed_allocations"] == 0, name
        assert r["peak_bytes_in_use"] == r["log_peak_bytes"], name
        assert r["peak_footprint"] is not None, name
        assert r["peak_footprint"] >= r["log_peak_bytes"], name
        assert r["ns_per_event"] > 0 and r["repeats"] == 3, name
    torch_row = rows[4]
    assert torch_row["fragmentation_at_peak"] is not None
    assert 0.0 <= torch_row["fragmentation_at_end"] <= 1.0
    assert rows[5]["fragmentation_at_peak"] is None, "CuPy shows no free blocks"


def test_transformer_log_fits_under_a_limit():
    doc = replay_json("--fit")
    fits = {(f["resource"], f["driver"]): f for f in doc["fits"]}
    peak = doc["reports"][0]["log_peak_bytes"]
    for peer in ("torch", "cupy"):
        fit = fits[(peer, "python")]
        assert fit["reason"] is None and fit["device_bytes"] is not None, fit
        assert fit["device_bytes"] >= peak, fit
        assert fit["failing_bytes"] < fit["device_bytes"]


@pytest.mark.parametrize("peer", ["torch", "cupy"])
def test_a_peers_out_of_memory_is_a_failed_event(tmp_path, peer):
    """The engine over PyTorch's and CuPy's allocators under a 1 GiB limit: their
    out-of-memory errors (PyTorch's is a RuntimeError) are failed events of the row, the free
    skipped, as a Rust kind's; the second stream is the peer's own."""
    from rrmm import _replay_peers, _rrmm

    mib = 1 << 20
    path = tmp_path / "over.csv"
    path.write_text(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        f"1,t,allocate,0x7f0000000000,{600 * mib},0\n"
        f"1,t,allocate,0x7f0040000000,{600 * mib},0x55d0c2a1e0f0\n"
        f"1,t,free,0x7f0000000000,{600 * mib},0\n"
        f"1,t,free,0x7f0040000000,{600 * mib},0x55d0c2a1e0f0\n")
    make = _replay_peers.torch_adapter if peer == "torch" else _replay_peers.cupy_adapter
    adapter = make(torch if peer == "torch" else cupy, gpu=True, limit=1 << 30)
    try:
        row = _replay_peers.replay(_rrmm.ReplayLog(str(path)), adapter, repeat=2)
    finally:
        adapter.close()
    assert row["error"] is None, row["error"]
    assert (row["failed_allocations"], row["failure_events"]) == (1, [1])
    assert row["peak_bytes_in_use"] == 600 * mib and row["repeats"] == 2
    assert row["peak_footprint"] is not None and row["peak_footprint"] >= 600 * mib
