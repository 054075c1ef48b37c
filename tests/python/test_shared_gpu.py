"""One GPU, many processes (``rrmm.shared_gpu``), on CPU: real processes sharing a ledger over
simulated devices and expandable pools on plain host memory (real bytes).

Each peer is ``shared_gpu_peer.py``, driven line by line. What is checked: a process that runs
short gets the others' cached memory back; an idle process above its share sleeps with its bytes
intact and wakes when busy or used; a process at or under its share, or busy, never sleeps; a
killed process leaves no claim; hostile or corrupt ledger files are refused with a reason and
never break an ask; many processes and threads asking at once.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import rrmm
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_gpu_fake_peer import entry

MIB = 1 << 20
PEER = Path(__file__).with_name("shared_gpu_peer.py")
#: This process's pid namespace: ledger files are named ``<pid>-<pid namespace>.json``.
NS = os.stat("/proc/self/ns/pid").st_ino


def entry_name(pid: int, ns: int = NS) -> str:
    """The file of process ``pid``'s entry."""
    return f"{pid}-{ns}.json"


class Peer:
    """A peer process and its command line."""

    def __init__(self, directory: Path, kind: str = "sim", soft_mib: int | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), str(directory), kind,
             "none" if soft_mib is None else str(soft_mib)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.read() == {"ready": True}

    def read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the peer ended"
        return json.loads(line)

    def __call__(self, command: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self("exit")
            except (AssertionError, BrokenPipeError):
                pass
            self.proc.wait(timeout=20)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture()
def ledger(tmp_path: Path) -> Path:
    d = tmp_path / "ledger"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture()
def peers() -> Any:
    made: list[Peer] = []
    yield made
    for p in made:
        p.close()


def settled(mr: Any, want: Any, timeout: float = 3.0) -> dict[int, Any]:
    """The ledger's rows once ``want(rows)`` holds (entries are written every 250 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r.pid: r for r in rrmm.shared_gpu.processes(mr)}
        if want(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def sim_member(ledger: Path, **options: Any) -> Any:
    mr = rrmm.mr.SimulatedMemoryResource("1GiB")
    rrmm.shared_gpu.join(mr, directory=ledger, **options)
    return mr


def test_a_short_process_gets_the_others_cache_back(ledger: Path, peers: list[Peer]) -> None:
    a, b = Peer(ledger), Peer(ledger)
    peers += [a, b]
    ca, cb = a("cache 300"), b("cache 200")
    assert ca >= 300 * MIB and cb >= 200 * MIB
    me = sim_member(ledger)
    rows = settled(me, lambda r: r[a.pid].cached and r[b.pid].cached)
    assert (rows[a.pid].cached, rows[b.pid].cached) == (ca, cb)
    # A 1 GiB device whose free part is what the others leave: 900 MiB needs both caches,
    # the one above its share (a third of the device) asked first.
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trim_asked"][0] == (a.pid if ca >= cb else b.pid), answer
    assert answer["trimmed"] == ca + cb, answer
    assert answer["sleep_asked"] == []
    assert answer["seconds"] < 1.0
    rows = settled(me, lambda r: r[a.pid].cached + r[b.pid].cached == 0)
    assert sum(rows[p.pid].cached for p in (a, b)) == 0
    kinds = [e["kind"] for e in a("history") + b("history")]
    assert "gave" in kinds
    mine = rrmm.shared_gpu.history(me)
    assert mine[-1]["kind"] == "asked" and mine[-1]["given"] == answer["trimmed"]
    rrmm.shared_gpu.leave(me)


def test_an_idle_process_above_its_share_sleeps_and_wakes_with_its_bytes(
    ledger: Path, peers: list[Peer]
) -> None:
    idle = Peer(ledger, kind="host", soft_mib=16)
    busy = Peer(ledger, kind="host", soft_mib=16)
    peers += [idle, busy]
    assert idle("fill 64") == 64 and busy("fill 64") == 64
    assert idle("idle") is True
    me = rrmm.mr.ExpandableMemoryResource(reserve_size=1 << 30, page_size=2 * MIB,
                                          pageable_host=True)
    rrmm.shared_gpu.join(me, directory=ledger, device_key="host-test", soft_share=16 * MIB)
    settled(me, lambda r: r[idle.pid].live >= 64 * MIB and r[idle.pid].idle
            and r[busy.pid].live >= 64 * MIB)
    total = rrmm.shared_gpu.processes(me)[0].total
    # 32 MiB more than the others leave (with the ask's 64 MiB of slack): nothing is cached,
    # so only a sleep can cover it.
    want = total - 128 * MIB - 32 * MIB
    answer = rrmm.shared_gpu.ask(want, me)
    assert answer["sleep_asked"] == [idle.pid], answer
    assert answer["slept"] >= 64 * MIB
    assert idle("asleep") is True
    assert busy("asleep") is False, "a busy process is never put to sleep"
    rows = {r.pid: r for r in rrmm.shared_gpu.processes(me)}
    assert rows[idle.pid].asleep >= 64 * MIB
    # Busy again: it wakes, every byte as it was.
    assert idle("busy") >= 64 * MIB
    assert idle("asleep") is False and idle("check") is True
    # Idle and asleep again; this time its next use wakes it (one of rrmm's copies).
    idle("idle")
    settled(me, lambda r: r[idle.pid].idle and r[idle.pid].live >= 64 * MIB)
    rrmm.shared_gpu.ask(want, me)
    assert idle("asleep") is True
    assert idle("check") is True, "a copy of a pool asleep until used wakes it"
    assert idle("asleep") is False
    rrmm.shared_gpu.leave(me)


def test_a_process_within_its_share_is_never_asked_to_sleep(
    ledger: Path, peers: list[Peer]
) -> None:
    small = Peer(ledger, kind="host", soft_mib=512)
    peers.append(small)
    small("fill 64")
    small("idle")
    me = rrmm.mr.ExpandableMemoryResource(reserve_size=1 << 30, page_size=2 * MIB,
                                          pageable_host=True)
    rrmm.shared_gpu.join(me, directory=ledger, device_key="host-test", soft_share=16 * MIB)
    settled(me, lambda r: r[small.pid].live >= 64 * MIB and r[small.pid].idle)
    total = rrmm.shared_gpu.processes(me)[0].total
    answer = rrmm.shared_gpu.ask(total - 64 * MIB - 32 * MIB, me)
    assert answer["sleep_asked"] == [] and answer["slept"] == 0
    assert small("asleep") is False
    rrmm.shared_gpu.leave(me)


def test_a_killed_process_leaves_no_claim(ledger: Path, peers: list[Peer]) -> None:
    a = Peer(ledger)
    peers.append(a)
    a("cache 300")
    me = sim_member(ledger)
    assert a.pid in {r.pid for r in rrmm.shared_gpu.processes(me)}
    os.kill(a.pid, signal.SIGKILL)
    a.proc.wait(timeout=10)
    started = time.monotonic()
    assert a.pid not in {r.pid for r in rrmm.shared_gpu.processes(me)}
    assert time.monotonic() - started < 1.0, "its share returns within a second"
    assert not (ledger / "simulated-1073741824" / entry_name(a.pid)).exists()
    # Asking a ledger whose other member died mid-answer: nobody to ask, nothing breaks.
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trim_asked"] == [] and answer["trimmed"] == 0
    rrmm.shared_gpu.leave(me)


def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(RuntimeError, match="other users can write"):
        sim_member(d)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(RuntimeError, match="symbolic link"):
        sim_member(link)
    with pytest.raises(ValueError, match="cannot name a ledger"):
        sim_member(tmp_path / "ok", device_key="../escape")
    with pytest.raises(ValueError, match="not a GPU's"):
        rrmm.shared_gpu.join(rrmm.mr.ExpandableMemoryResource(
            reserve_size=1 << 24, page_size=2 * MIB, pageable_host=True), directory=tmp_path)


def test_corrupt_and_hostile_files_are_refused_and_asks_go_on(
    ledger: Path, peers: list[Peer]
) -> None:
    a = Peer(ledger)
    peers.append(a)
    cached = a("cache 100")
    me = sim_member(ledger)
    settled(me, lambda r: r[a.pid].cached == cached)
    dev = ledger / "simulated-1073741824"
    (dev / entry_name(12345)).write_text('{"version": 3, "holder": {"pid": 12345')
    (dev / entry_name(23456)).write_text(json.dumps({"version": 3, "holder": {"pid": 1}}))
    os.mkfifo(dev / entry_name(34567))
    (dev / entry_name(45678)).symlink_to("/etc/hostname")
    big = entry(56789, NS, 0, 1 << 30, live=1 << 40, idle=True, updated=0.0)
    (dev / entry_name(56789)).write_text(json.dumps(big))
    (dev / "67890.json").write_text(json.dumps({**big, "version": 1, "pid": 67890}))
    refused = dict(rrmm.shared_gpu.refused_files(me))
    assert set(refused) == {entry_name(p) for p in (12345, 23456, 34567, 45678, 56789)} | {
        "67890.json"}
    assert "not a ledger entry" in refused[entry_name(12345)]
    assert "not a regular file" in refused[entry_name(34567)]
    assert "beyond" in refused[entry_name(56789)]
    assert "older rrmm" in refused["67890.json"]
    answer = rrmm.shared_gpu.ask(950 * MIB, me)
    assert answer["trim_asked"] == [a.pid] and answer["trimmed"] == cached
    assert "refused" in answer["note"]
    rrmm.shared_gpu.leave(me)


def test_many_processes_and_threads_ask_at_once(ledger: Path, peers: list[Peer]) -> None:
    many = [Peer(ledger) for _ in range(5)]
    peers += many
    cached = sum(p("cache 100") for p in many)
    me = sim_member(ledger)
    settled(me, lambda r: sum(r[p.pid].cached for p in many) == cached)
    answers: list[dict[str, Any]] = []

    def ask() -> None:
        answers.append(rrmm.shared_gpu.ask(900 * MIB, me))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(answers) == 4
    assert sum(a["trimmed"] for a in answers) == cached, "each cache given once"
    # The peers ask each other meanwhile: no deadlock, every answer within the wait.
    results = [p("ask 900") for p in many[:2]]
    assert all(r["seconds"] < 5 for r in results)
    rrmm.shared_gpu.leave(me)


def test_the_hard_limit_is_never_passed(ledger: Path) -> None:
    mr = rrmm.mr.SimulatedMemoryResource("1GiB")
    pool = rrmm.mr.PoolMemoryResource(mr, initial_pool_size=0)
    rrmm.shared_gpu.join(pool, directory=ledger, hard_limit="100MiB")
    assert rrmm.shared_gpu.status(pool)["hard_limit"] == 100 * MIB  # type: ignore[index]
    kept = [pool.allocate(30 * MIB) for _ in range(3)]
    with pytest.raises(MemoryError, match="hard limit"):
        pool.allocate(30 * MIB)
    for p in kept:
        pool.deallocate(p, 30 * MIB)
    # Cached memory counts until it goes back: the pool's cache is relieved first.
    again = pool.allocate(90 * MIB)
    pool.deallocate(again, 90 * MIB)
    assert rrmm.shared_gpu.history(pool)[-1]["kind"] == "refused"
    rrmm.shared_gpu.leave(pool)


def test_idle_context_manager_and_env_options(ledger: Path, monkeypatch: Any) -> None:
    mr = sim_member(ledger, soft_share="25%")
    status = rrmm.shared_gpu.status(mr)
    assert status is not None and status["soft_share"] is not None
    with rrmm.shared_gpu.idle(mr):
        assert rrmm.shared_gpu.status(mr)["idle"] is True  # type: ignore[index]
    assert rrmm.shared_gpu.status(mr)["idle"] is False  # type: ignore[index]
    assert rrmm.shared_gpu.leave(mr) is True
    assert rrmm.shared_gpu.leave(mr) is False
    with pytest.raises(RuntimeError, match="has not joined"):
        rrmm.shared_gpu.declare_idle(mr)
    ledgers = rrmm.shared_gpu.read_ledgers(ledger)
    assert list(ledgers) == ["simulated-1073741824"]
    with pytest.raises(TypeError):
        rrmm.shared_gpu.join(mr, directory=ledger, soft_share=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="percentage"):
        rrmm.shared_gpu.join(mr, directory=ledger, soft_share="150%")


@settings(max_examples=60, deadline=None)
@given(st.one_of(
    st.binary(max_size=400),
    st.dictionaries(st.sampled_from(["version", "pid", "started", "name", "total", "live",
                                     "cached", "idle", "history", "x"]),
                    st.one_of(st.integers(-2**70, 2**70), st.text(max_size=20), st.none(),
                              st.booleans(), st.floats()), max_size=10).map(
        lambda d: json.dumps(d).encode()),
))
def test_any_file_in_the_ledger_is_read_or_refused(tmp_path_factory: Any, content: bytes) -> None:
    d = tmp_path_factory.mktemp("ledger")
    d.chmod(0o700)
    mr = sim_member(d)
    dev = d / "simulated-1073741824"
    (dev / entry_name(4242)).write_bytes(content)
    try:
        rows = rrmm.shared_gpu.processes(mr)
        refused = dict(rrmm.shared_gpu.refused_files(mr))
        assert os.getpid() in {r.pid for r in rows}
        assert 4242 not in {r.pid for r in rows}, "never trusted: no process 4242 runs"
        assert entry_name(4242) in refused or not (dev / entry_name(4242)).exists()
        assert rrmm.shared_gpu.ask(10 * MIB, mr)["trimmed"] == 0
    finally:
        rrmm.shared_gpu.leave(mr)
    assert stat.S_IMODE(dev.stat().st_mode) == 0o700


def test_a_refusal_after_asking_says_who_holds_what(ledger: Path, peers: list[Peer]) -> None:
    a = Peer(ledger)
    peers.append(a)
    a("cache 100")
    mr = rrmm.mr.SimulatedMemoryResource("1GiB")
    pool = rrmm.mr.PoolMemoryResource(mr, initial_pool_size=0)
    rrmm.shared_gpu.join(pool, directory=ledger, name="me")
    try:
        with pytest.raises(MemoryError) as refused:
            pool.allocate(2 << 30)
        message = str(refused.value)
        assert "asked first" in message, message
        assert f"pid {os.getpid()} (this one) (me)" in message, message
        assert f"pid {a.pid} " in message and "peer-sim" in message, message
        assert rrmm.shared_gpu.history(pool)[-1]["kind"] == "asked"
        # The pool still works after the refusal.
        pool.deallocate(pool.allocate(1 << 20), 1 << 20)
    finally:
        rrmm.shared_gpu.leave(pool)


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                 st.text(max_size=12), st.binary(max_size=4), st.lists(st.integers(), max_size=2))


@settings(max_examples=80, deadline=None)
@given(option=st.sampled_from(["soft_share", "hard_limit", "name", "device_key"]),
       value=st.one_of(_ANY, st.sampled_from(["25%", "150%", "-1%", "1GiB", "1G", "x%", "", ".",
                                              "..", "a/b", "\x00", "1" * 80])))
def test_any_join_option_joins_or_is_a_clear_error_and_the_resource_works(
    tmp_path_factory: Any, option: str, value: Any
) -> None:
    d = tmp_path_factory.mktemp("ledger")
    d.chmod(0o700)
    mr = rrmm.mr.SimulatedMemoryResource("1GiB")
    options: dict[str, Any] = {"directory": d, option: value}
    try:
        rrmm.shared_gpu.join(mr, **options)
    except (ValueError, TypeError, RuntimeError, OverflowError) as e:
        assert str(e), "an error says why"
        assert not rrmm.shared_gpu.joined(mr)
    else:
        assert rrmm.shared_gpu.joined(mr)
        status = rrmm.shared_gpu.status(mr)
        assert status is not None and status["pid"] == os.getpid()
        row = next(r for r in rrmm.shared_gpu.processes(mr) if r.pid == os.getpid())
        assert 0 <= len(row.name) <= 64
    finally:
        rrmm.shared_gpu.leave(mr)
    # Whatever happened, the resource still serves and takes back.
    mr.deallocate(mr.allocate(1 << 20), 1 << 20)
    with pytest.raises(ValueError):
        rrmm.shared_gpu.ask(-1, mr)


def test_every_join_option_is_checked_before_anything_changes(
    ledger: Path, monkeypatch: Any
) -> None:
    mr = sim_member(ledger, soft_share="10%")
    before = rrmm.shared_gpu.status(mr)
    refused: list[tuple[type[BaseException], str, dict[str, Any]]] = [
        (TypeError, "not bool", {"soft_share": True}),
        (TypeError, "not bool", {"hard_limit": False}),
        (ValueError, "0% to 100%", {"soft_share": "150%"}),
        (ValueError, "more than the device", {"soft_share": 2 << 30}),
        (ValueError, "above the hard limit", {"soft_share": "512MiB", "hard_limit": "256MiB"}),
        (ValueError, "above the hard limit", {"soft_share": "60%", "hard_limit": "50%"}),
        (ValueError, "not a size", {"hard_limit": "1G"}),
        (TypeError, "name must be a str", {"name": 3}),
        (ValueError, "cannot name a ledger", {"device_key": "a/b"}),
    ]
    for error, match, options in refused:
        with pytest.raises(error, match=match):
            rrmm.shared_gpu.join(mr, directory=ledger, **options)
        assert rrmm.shared_gpu.status(mr) == before, f"{options}: the old membership stays"
    # The MPS pinned memory limit, read as MPS writes it, or refused: never silently none.
    for value, limit in [("100MB", 100 * MIB), ("0=256M,1=1G", 256 * MIB), ("1G", 1 << 30)]:
        monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", value)
        rrmm.shared_gpu.join(mr, directory=ledger)
        status = rrmm.shared_gpu.status(mr)
        assert status is not None
        assert (status["hard_limit"], status["hard_limit_from"]) == (limit, "mps"), value
    for value in ["1.5G", "lots", "0=1G,one=2G"]:
        monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", value)
        with pytest.raises(ValueError, match="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
            rrmm.shared_gpu.join(mr, directory=ledger)
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "100MB")
    with pytest.raises(ValueError, match="above the hard limit"):
        rrmm.shared_gpu.join(mr, directory=ledger, soft_share="200MiB")
    rrmm.shared_gpu.leave(mr)


def test_the_keys_of_a_process_row_agree_with_what_rust_gives() -> None:
    fields = set(rrmm.shared_gpu.ProcessRow.__dataclass_fields__)
    mr = rrmm.mr.SimulatedMemoryResource("1GiB")
    directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"rl-keys-{os.getpid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    rrmm.shared_gpu.join(mr, directory=directory)
    try:
        rows, _ = rrmm._rrmm._shared_gpu_processes(mr)
        assert fields == set(rows[0]) - {"started"}, "started is read, not shown"
        read, _ = rrmm._rrmm._shared_gpu_read(str(directory / "simulated-1073741824"))
        assert set(read[0]) == set(rows[0])
    finally:
        rrmm.shared_gpu.leave(mr)
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
