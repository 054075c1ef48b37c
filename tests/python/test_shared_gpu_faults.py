"""One GPU, many processes (``rrmm.shared_gpu``) when the others misbehave, with real processes on
CPU (simulated devices): a peer that is stopped, slow, killed, flooding, forging answers, or in
another pid namespace.

What is checked: every wait has a deadline and the report names who did not answer; a send never
waits (a full queue fails at once); one worker thread per member whatever arrives; an answer
counts only from the process asked and at most what its entry shows, never more than the device;
a process of another pid namespace is neither removed nor removes; ``leave()`` is quick whatever
the peers do.

Peers: ``shared_gpu_peer.py`` (rrmm itself) and ``shared_gpu_fake_peer.py`` (the protocol by
hand, answering as told).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rrmm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_gpu_fake_peer import entry
from test_shared_gpu import NS, Peer, entry_name, settled

MIB = 1 << 20
TOTAL = 1 << 30
KEY = "simulated-1073741824"
FAKE = Path(__file__).with_name("shared_gpu_fake_peer.py")
#: The deadline of a trim (rrmm's TRIM_WAIT), and room for a loaded machine.
DEADLINE = 1.0
SLACK = 1.5


class Fake(Peer):
    """A fake peer process (``shared_gpu_fake_peer.py``); ``fake(command, arg)`` sends
    ``command`` with ``arg`` as JSON."""

    def __init__(self, ledger: Path) -> None:
        (ledger / KEY).mkdir(mode=0o700, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(FAKE), str(ledger / KEY), str(TOTAL)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = self.read()
        self.ns, self.socket = hello["ns"], hello["socket"]
        assert hello["pid"] == self.pid

    def __call__(self, command: str, arg: Any = None) -> Any:
        return super().__call__(command if arg is None else f"{command} {json.dumps(arg)}")


@pytest.fixture()
def ledger() -> Iterator[Path]:
    """A ledger directory with a short path: members' sockets live in it."""
    path = Path(tempfile.mkdtemp(prefix="rl-"))  # mode 0700
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def procs() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for p in made:
        if isinstance(p, Peer) and p.proc.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
        p.close()


def member(ledger: Path, **options: Any) -> Any:
    pool = rrmm.mr.PoolMemoryResource(rrmm.mr.SimulatedMemoryResource(TOTAL), initial_pool_size=0)
    rrmm.shared_gpu.join(pool, directory=ledger, **options)
    return pool


def stop(pid: int) -> None:
    """Stops process ``pid`` (SIGSTOP) and waits until every thread of it is stopped (the
    main thread stops first; a thread still running could read a datagram meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                states.append(stat[stat.rfind(")") + 2])
        if states and all(state in "Tt" for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def leave_quickly(mr: Any) -> None:
    """Leaves the ledger, within half a second whatever the peers did."""
    started = time.monotonic()
    rrmm.shared_gpu.leave(mr)
    assert time.monotonic() - started < 0.5


def refusals(mr: Any) -> list[dict[str, Any]]:
    return [e for e in rrmm.shared_gpu.history(mr) if e["kind"] == "refused"]


def test_a_stopped_peer_costs_at_most_the_deadline_and_is_named(
    ledger: Path, procs: list[Any]
) -> None:
    a, b = Peer(ledger), Peer(ledger)
    procs += [a, b]
    ca, cb = a("cache 300"), b("cache 200")
    me = member(ledger, name="me")
    settled(me, lambda r: r[a.pid].cached == ca and r[b.pid].cached == cb)
    stop(a.pid)
    try:
        started = time.monotonic()
        answer = rrmm.shared_gpu.ask(900 * MIB, me)
        took = time.monotonic() - started
        assert DEADLINE <= took < DEADLINE + SLACK, answer
        assert answer["trimmed"] == cb, "the others answered meanwhile"
        assert answer["unanswered"] == [a.pid], answer
        silent = f"no answer to trim within the deadline of 1.0 s from pid {a.pid}"
        assert silent in answer["note"], answer
        # Asked again: it has written nothing since, so nobody waits for it.
        started = time.monotonic()
        again = rrmm.shared_gpu.ask(900 * MIB, me)
        assert time.monotonic() - started < 0.5, again
        assert again["unanswered"] == [a.pid] and f"not asked: pid {a.pid}" in again["note"]
        # An allocation refused after asking says so.
        with pytest.raises(MemoryError) as refused:
            me.allocate(2 << 30)
        assert silent in str(refused.value) or (
            f"not asked: pid {a.pid}" in str(refused.value)), str(refused.value)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    # Running again, it answers what waited in its queue (it trims; the answer is late:
    # dropped here), writes its entry and is asked again.
    settled(me, lambda r: r[a.pid].cached == 0)
    assert a("cache 300") == ca
    settled(me, lambda r: r[a.pid].cached == ca)
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trimmed"] == ca and answer["unanswered"] == [], answer
    assert refusals(me) == [], "late answers are dropped, not refused"
    leave_quickly(me)


def test_a_full_queue_fails_the_send_at_once(ledger: Path, procs: list[Any]) -> None:
    fake = Fake(ledger)
    procs.append(fake)
    fake("mode", {"answer": "silent"})
    fake("entry", {"cached": 300 * MIB})
    me = member(ledger)
    # Fill the fake's queue: stop it and send until the kernel refuses.
    stop(fake.pid)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            for _ in range(1000):
                s.sendto(b"{}", fake.socket)
        started = time.monotonic()
        answer = rrmm.shared_gpu.ask(900 * MIB, me)
        assert time.monotonic() - started < 0.5, answer
        assert answer["unanswered"] == [fake.pid]
        assert f"pid {fake.pid} not reached: its queue is full" in answer["note"], answer
    finally:
        os.kill(fake.pid, signal.SIGCONT)
    rrmm.shared_gpu.leave(me)


def test_a_slow_peer_counts_within_the_deadline_and_not_after(
    ledger: Path, procs: list[Any]
) -> None:
    fake = Fake(ledger)
    procs.append(fake)
    me = member(ledger)
    fake("mode", {"answer": "honest", "delay": 0.3})
    fake("entry", {"cached": 300 * MIB})
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trimmed"] == 300 * MIB and answer["unanswered"] == [], answer
    fake("mode", {"answer": "honest", "delay": 2.0})
    fake("entry", {"cached": 300 * MIB})
    started = time.monotonic()
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert time.monotonic() - started < DEADLINE + SLACK
    assert answer["trimmed"] == 0 and answer["unanswered"] == [fake.pid], answer
    time.sleep(1.5)  # its answer comes late: dropped, neither counted nor refused
    assert refusals(me) == []
    rrmm.shared_gpu.leave(me)


def test_a_killed_peer_is_dropped_and_the_ask_goes_on(ledger: Path, procs: list[Any]) -> None:
    a, b = Peer(ledger), Fake(ledger)
    procs += [a, b]
    a("cache 300")
    b("entry", {"cached": 200 * MIB})
    me = member(ledger)
    settled(me, lambda r: r[a.pid].cached > 0)
    os.kill(a.pid, signal.SIGKILL)
    a.proc.wait(timeout=10)
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trimmed"] == 200 * MIB and answer["trim_asked"] == [b.pid], answer
    assert answer["seconds"] < 0.5
    assert a.pid not in {r.pid for r in rrmm.shared_gpu.processes(me)}
    assert not (ledger / KEY / entry_name(a.pid)).exists()
    rrmm.shared_gpu.leave(me)


def test_a_flood_of_sleep_requests_makes_no_thread_and_the_member_still_answers(
    ledger: Path, procs: list[Any]
) -> None:
    flooder, prober = Fake(ledger), Fake(ledger)
    procs += [flooder, prober]
    me = member(ledger)
    rrmm.shared_gpu.declare_idle(me)
    path = rrmm.shared_gpu.status(me)["socket"]  # type: ignore[index]
    counts: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            counts.append(threads())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    time.sleep(0.05)
    before = max(counts)
    try:
        for never_read in (False, True):
            result = flooder(f"flood {path} 3000 sleep" + (" never_read" if never_read else ""))
            assert result["sent"] == 3000
            probe = prober(f"probe {path} 2")
            assert probe["answered"], "the member still answers"
    finally:
        stop.set()
        sampler.join()
    assert max(counts) <= before, f"{max(counts)} threads during the flood, {before} before"
    declined = [e for e in rrmm.shared_gpu.history(me) if "busy" in e["note"]]
    assert declined, "a full queue is declined at once, saying busy"
    leave_quickly(me)


def test_a_never_read_socket_named_as_sender_freezes_nothing(
    ledger: Path, procs: list[Any]
) -> None:
    fake, helper = Fake(ledger), Fake(ledger)
    procs += [fake, helper]
    me = member(ledger)
    path = rrmm.shared_gpu.status(me)["socket"]  # type: ignore[index]
    # Give requests from a socket nobody reads, naming another process as the sender: every
    # answer goes where the request came from and fails at once once its queue is full.
    result = fake(f"flood {path} 500 give never_read")
    assert result["seconds"] < 5
    # The listener still routes: a peer's cache still comes back to an ask.
    helper("entry", {"cached": 100 * MIB})
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trimmed"] == 100 * MIB, answer
    assert prober_answers(helper, path)
    leave_quickly(me)


def prober_answers(fake: Fake, path: str) -> bool:
    return bool(fake(f"probe {path} 2")["answered"])


@pytest.mark.parametrize("forgery", ["other_sender", "unknown_id", "absurd", "no_drop"])
def test_forged_answers_count_nothing(ledger: Path, procs: list[Any], forgery: str) -> None:
    fake = Fake(ledger)
    procs.append(fake)
    me = member(ledger)
    fake("entry", {"cached": 300 * MIB})
    mode: dict[str, Any] = {
        "other_sender": {"answer": "other_sender"},
        "unknown_id": {"answer": "unknown_id"},
        "absurd": {"answer": "claim", "given": 2**63},
        "no_drop": {"answer": "claim", "given": 300 * MIB},
    }[forgery]
    fake("mode", mode)
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trimmed"] == 0 and answer["slept"] == 0, answer
    time.sleep(0.1)
    refused = refusals(me)
    if forgery == "no_drop":
        # Its own answer, but its entry shows nothing given: nothing counts (no forgery to
        # record: the process asked may have given less than it thought).
        assert refused == []
        return
    assert len(refused) == 1, rrmm.shared_gpu.history(me)
    why = refused[0]["note"]
    expected = {
        "other_sender": f"not by process {fake.pid}",
        "unknown_id": "never made",
        "absurd": "more than the device",
    }[forgery]
    assert expected in why, why
    if forgery == "absurd":
        assert fake.pid not in answer["unanswered"], "its answer ended the wait"
    else:
        assert answer["unanswered"] == [fake.pid], answer
    rrmm.shared_gpu.leave(me)


@pytest.fixture(scope="module")
def forger() -> Iterator[tuple[Fake, Any, str]]:
    """One fake peer and one member, kept across the generated examples."""
    path = Path(tempfile.mkdtemp(prefix="rl-"))
    fake = Fake(path)
    pool = member(path)
    yield fake, pool, rrmm.shared_gpu.status(pool)["socket"]  # type: ignore[index]
    rrmm.shared_gpu.leave(pool)
    fake.close()
    shutil.rmtree(path, ignore_errors=True)


_FIGURES = st.integers(0, TOTAL).flatmap(
    lambda live: st.fixed_dictionaries({
        "live": st.just(live), "cached": st.integers(0, TOTAL - live),
        "asleep": st.integers(0, 64 * TOTAL), "idle": st.booleans()}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(before=_FIGURES, after=_FIGURES, claimed=st.integers(0, 2**64 - 1),
       noise=st.lists(st.binary(max_size=300), max_size=3), nbytes=st.integers(0, 2 * TOTAL))
def test_no_answer_and_no_datagram_makes_an_ask_count_more_than_the_device_or_the_drop(
    forger: tuple[Fake, Any, str], before: dict[str, Any], after: dict[str, Any], claimed: int,
    noise: list[bytes], nbytes: int,
) -> None:
    fake, pool, path = forger
    for datagram in noise:
        fake(f"send {path} {datagram.hex() or '00'}")
    fake("entry", before)
    fake("mode", {"answer": "claim", "given": claimed, "after": after})
    answer = rrmm.shared_gpu.ask(nbytes, pool)
    counted = answer["trimmed"] + answer["slept"]
    assert counted <= TOTAL, answer
    held = before["live"] + before["cached"]
    assert counted <= max(0, held - after["live"] - after["cached"]), (answer, before, after)
    assert counted <= claimed


# ------------------------------------------------------------------ pid namespaces

def _unshare_works() -> str | None:
    """Why a process in a pid namespace of its own cannot be started here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    try:
        r = subprocess.run(["unshare", "--user", "--pid", "--fork", "--map-root-user", "true"],
                           capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    return None if r.returncode == 0 else f"unshare is not allowed here: {r.stderr.strip()}"


class NamespacedPeer(Peer):
    """``shared_gpu_peer.py`` as process 1 of a pid namespace (and user namespace) of its own,
    seeing this namespace's ``/proc`` (as a container sharing ``/dev/shm`` may)."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "--user", "--pid", "--fork", "--map-root-user", "--kill-child",
             sys.executable, str(Path(__file__).with_name("shared_gpu_peer.py")),
             str(directory), "sim", "none"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.read() == {"ready": True}


def test_a_peer_in_another_pid_namespace_is_neither_removed_nor_removes(
    ledger: Path, procs: list[Any]
) -> None:
    why = _unshare_works()
    if why is not None:
        pytest.skip(why)
    inner = NamespacedPeer(ledger)
    procs.append(inner)
    cached = inner("cache 300")
    me = member(ledger)
    rows = settled(me, lambda r: any(row.pid_ns != NS and row.cached for row in r.values()))
    (theirs,) = [r for r in rows.values() if r.pid_ns != NS]
    assert theirs.pid == 1 and not theirs.stale, "process 1 of its namespace, alive"
    # Process 1 here is another process (init): judged by this namespace's /proc it would be
    # dead. It is not removed, listing after listing.
    for _ in range(5):
        assert theirs.pid_ns in {r.pid_ns for r in rrmm.shared_gpu.processes(me)}
        time.sleep(0.05)
    assert (ledger / KEY / entry_name(1, theirs.pid_ns)).exists()
    # Its answers are believed: the kernel names it by its pid here, /proc says it is process
    # 1 of its namespace, started when its entry says.
    answer = rrmm.shared_gpu.ask(900 * MIB, me)
    assert answer["trimmed"] == cached and answer["unanswered"] == [], answer
    assert refusals(me) == []
    # It reads the ledger (and asks us): our entry stays. From its namespace this process
    # cannot be seen, so what we answer it counts nothing there (and says so in its history).
    inner("cache 100")
    me.deallocate(me.allocate(200 * MIB), 200 * MIB)
    inner("ask 900")
    assert inner("figures") is not None
    time.sleep(0.3)
    assert (ledger / KEY / entry_name(os.getpid())).exists(), "it removed nothing of ours"
    mine = {r.pid for r in rrmm.shared_gpu.processes(me) if r.pid_ns == NS}
    assert os.getpid() in mine
    rrmm.shared_gpu.leave(me)


def test_a_stale_entry_of_another_namespace_is_shown_as_such_and_never_removed(
    ledger: Path,
) -> None:
    me = member(ledger)
    dev = ledger / KEY
    fields = {"name": "elsewhere", "live": 300 * MIB, "idle": True}
    stale = entry(1, NS + 1, 5, TOTAL, **fields, updated=time.time() - 120)
    (dev / entry_name(1, NS + 1)).write_text(json.dumps(stale))
    (dev / entry_name(2, NS + 1)).write_text(json.dumps(entry(2, NS + 1, 5, TOTAL, **fields)))
    rows = {r.pid: r for r in rrmm.shared_gpu.processes(me) if r.pid_ns == NS + 1}
    assert rows[1].stale and not rows[2].stale
    assert [r.pid for r in rrmm.shared_gpu.processes(me)][-1] == 1, "stale rows last"
    ledgers = rrmm.shared_gpu.read_ledgers(ledger)
    assert {(r.pid, r.stale) for r in ledgers[KEY]["processes"] if r.pid_ns == NS + 1} == {
        (1, True), (2, False)}
    assert (dev / entry_name(1, NS + 1)).exists() and (dev / entry_name(2, NS + 1)).exists()
    rrmm.shared_gpu.leave(me)


def test_reading_the_ledgers_removes_nothing(ledger: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(done.stdout)
    dev = ledger / KEY
    dev.mkdir(mode=0o700)
    (dev / entry_name(dead)).write_text(json.dumps(entry(dead, NS, 5, TOTAL, name="gone")))
    ledgers = rrmm.shared_gpu.read_ledgers(ledger)
    refused = dict(ledgers[KEY]["refused"])
    assert "is gone" in refused[entry_name(dead)]
    assert (dev / entry_name(dead)).exists(), "rrmm info removes nothing"
    me = member(ledger)
    rrmm.shared_gpu.processes(me)
    assert not (dev / entry_name(dead)).exists(), "a member that sees it dead removes it"
    rrmm.shared_gpu.leave(me)
