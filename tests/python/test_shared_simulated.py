"""A simulated device that several processes share by a name (issue 50): two processes on it
compete for one device's bytes, one gives back to the other when the ledger asks, a dead one's
bytes return, and every process joins its device's ledger under ``RRMM_SHARE_GPU`` however its
resource is set. Runs on any machine: the peer is a real second process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rrmm
from rrmm import mr

MiB = 1 << 20

PEER = """
import sys, rrmm.mr
name, live, cached = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pool = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource("1GiB", shared=name), 0)
rrmm.mr.set_current_device_resource(pool)  # joins the ledger: RRMM_SHARE_GPU is set
kept = pool.allocate(live) if live else 0
if cached:
    pool.deallocate(pool.allocate(cached), cached)
print("ready", rrmm.shared_gpu.joined(pool), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A private ledger directory, and the environment a peer needs."""
    base = tmp_path / "ledgers"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("RRMM_LEDGER_DIR", str(base))
    env = {**os.environ, "RRMM_LEDGER_DIR": str(base), "RRMM_SHARE_GPU": "1"}
    yield env
    rrmm._rrmm._clear_per_device_resources()


def start_peer(env: dict[str, str], name: str, live: int = 0, cached: int = 0) -> Any:
    peer = subprocess.Popen([sys.executable, "-c", PEER, name, str(live), str(cached)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = peer.stdout.readline()  # type: ignore[union-attr]
    assert line == "ready True\n", (line, peer.stderr.read() if peer.poll() is not None else "")  # type: ignore[union-attr]
    return peer


def stop(peer: Any) -> None:
    peer.communicate("", timeout=30)


@contextlib.contextmanager
def beside_a_peer(env: dict[str, str], name: str, **held: int) -> Iterator[tuple[Any, Any]]:
    """A peer holding ``held`` (``live``, ``cached``) of the shared device ``name``, and a pool
    of this process over the same device, in its ledger: (peer, pool)."""
    peer = start_peer(env, name, **held)
    try:
        pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource("1GiB", shared=name), 0)
        rrmm.shared_gpu.join(pool)
        yield peer, pool
        rrmm.shared_gpu.leave(pool)
    finally:
        stop(peer)


def test_two_processes_compete_for_one_device(ledger: dict[str, str]) -> None:
    name = f"compete-{os.getpid()}"
    peer = start_peer(ledger, name, live=800 * MiB)
    try:
        device = mr.SimulatedMemoryResource("1GiB", shared=name)
        assert device.shared == name
        with pytest.raises(MemoryError) as e:
            device.allocate(600 * MiB)
        message = str(e.value)
        assert f"shared as {name!r}".replace("'", '"') in message, message
        assert f"the other processes on it {800 * MiB}" in message, message
        ptr = device.allocate(200 * MiB)  # what the peer leaves
        device.deallocate(ptr, 200 * MiB)
    finally:
        stop(peer)
    # The peer is gone: its bytes are the device's again.
    device = mr.SimulatedMemoryResource("1GiB", shared=name)
    device.deallocate(device.allocate(1000 * MiB), 1000 * MiB)


def test_one_process_gives_back_to_the_other_when_the_ledger_asks(
    ledger: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"give-{os.getpid()}"
    peer = start_peer(ledger, name, cached=800 * MiB)
    try:
        monkeypatch.setenv("RRMM_SHARE_GPU", "1")
        pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource("1GiB", shared=name), 0)
        mr.set_current_device_resource(pool)
        assert rrmm.shared_gpu.joined(pool)
        # The peer writes its entry every quarter second.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = {r.pid: r for r in rrmm.shared_gpu.processes(pool)}
            if rows.get(peer.pid) and rows[peer.pid].cached >= 800 * MiB:
                break
            time.sleep(0.05)
        assert rows[peer.pid].cached >= 800 * MiB, rows
        ptr = pool.allocate(600 * MiB)  # 224 MiB free: the peer is asked and trims
        asked = [e for e in rrmm.shared_gpu.history(pool) if e["kind"] == "asked"]
        assert asked and asked[-1]["given"] >= 600 * MiB - 224 * MiB, asked
        # The peer's entry: its cache given back, and (written at its next quarter second) the
        # event that says so.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = {r.pid: r for r in rrmm.shared_gpu.processes(pool)}[peer.pid]
            if any(e["kind"] == "gave" for e in row.history):
                break
            time.sleep(0.05)
        assert row.cached == 0, row
        assert any(e["kind"] == "gave" and e["given"] >= 800 * MiB for e in row.history), row
        pool.deallocate(ptr, 600 * MiB)
        rrmm.shared_gpu.leave(pool)
    finally:
        stop(peer)


def test_an_answer_its_entry_does_not_show_yet_is_worth_another_try(
    ledger: dict[str, str]
) -> None:
    # Asked at once: the peer's entry (written every quarter second) may not show its cache
    # yet, so its answer counts less than it gave; the allocation is tried again all the same,
    # and the free memory is read from the shared device itself, not from the entries.
    with beside_a_peer(ledger, f"stale-{os.getpid()}", cached=800 * MiB) as (_, pool):
        ptr = pool.allocate(600 * MiB)
        asked = [e for e in rrmm.shared_gpu.history(pool) if e["kind"] == "asked"][-1]
        assert asked["bytes"] == 600 * MiB, asked
        pool.deallocate(ptr, 600 * MiB)
        report = rrmm.shared_gpu.ask(600 * MiB, pool)
        assert report["shortfall"] == 0 and "nobody asked: the device has" in report["note"], report


def test_a_refusal_after_asking_names_the_holders(ledger: dict[str, str]) -> None:
    with beside_a_peer(ledger, f"refuse-{os.getpid()}", live=800 * MiB) as (peer, pool):
        with pytest.raises(MemoryError) as e:
            pool.allocate(600 * MiB)
        assert f"pid {peer.pid}" in str(e.value), str(e.value)


def test_every_way_of_setting_a_resource_joins_under_rrmm_share_gpu(
    ledger: dict[str, str]
) -> None:
    code = ("import rrmm, rrmm.mr\n"
            "plain = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource('64MiB'), 0)\n"
            "rrmm.mr.set_current_device_resource(plain)\n"
            "assert rrmm.shared_gpu.joined(plain)\n"
            "shared = rrmm.mr.SimulatedMemoryResource('64MiB', shared='joins')\n"
            "rrmm.mr.set_per_device_resource(1, shared)\n"
            "assert rrmm.shared_gpu.joined(shared)\n"
            "assert rrmm.shared_gpu.status(shared)['directory'].endswith('shared-joins')\n"
            "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], env=ledger, capture_output=True,
                         text=True, check=False, timeout=120)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr


def test_a_bad_name_or_another_size_is_refused(ledger: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="cannot name a shared device"):
        mr.SimulatedMemoryResource("1GiB", shared="../x")
    with pytest.raises(ValueError, match="host_memory or shared"):
        mr.SimulatedMemoryResource("1GiB", shared="x", host_memory="1GiB")
    name = f"size-{os.getpid()}"
    held = mr.SimulatedMemoryResource("1GiB", shared=name)
    ptr = held.allocate(MiB)
    with pytest.raises(ValueError, match="is 1073741824 bytes"):
        mr.SimulatedMemoryResource("2GiB", shared=name)
    held.deallocate(ptr, MiB)
