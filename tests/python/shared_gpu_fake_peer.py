"""A process that speaks a shared GPU ledger's protocol without rrmm (tests/test_shared_gpu*.py):
its own entry file and socket, written by hand, and answers as a test tells it to: honestly,
slowly, never, or forged (from another process, to a request never made, claiming any bytes).
Driven line by line on stdin, one JSON line answered per command.

Usage: ``shared_gpu_fake_peer.py <ledger directory> <total bytes>`` (the directory of one
device's ledger, short enough for its socket to live in it). Commands:

- ``entry {"live": .., "cached": .., "asleep": .., "idle": .., "soft_share": ..}``: writes
  its entry (fields left out keep their value).
- ``mode {"answer": "honest" | "silent" | "other_sender" | "unknown_id" | "claim",
  "delay": s, "given": n, "after": {entry fields}}``: how it answers the requests it gets from
  now on. ``honest`` gives back its cache (its entry written before the answer); ``claim``
  writes ``after`` into its entry, then claims ``given``; ``other_sender`` gives back its cache
  and has a child process send the answer; ``unknown_id`` answers from itself with an id never
  given.
- ``requests``: the requests received so far (``op``, ``id``, ``from``, ``bytes``).
- ``send <path> <hex>``: sends raw bytes to a socket, from its own.
- ``flood <path> <n> <op> [never_read]``: sends ``n`` requests to a socket (from a socket that
  is never read with ``never_read``), waiting while its queue is full; says how long it took.
- ``probe <path> <seconds>``: sends a give request and waits for its answer.
- ``exit``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

#: An entry's fields that say what its process holds: its ``holder`` object (with its ``pid``).
HELD = ("live", "cached", "soft_share", "hard_limit", "idle", "asleep")


def entry(pid: int, ns: int, started: int, total: int, **fields: Any) -> dict[str, Any]:
    """An entry of ledger version 3 of process ``pid`` of pid namespace ``ns``, written now,
    holding nothing but ``fields`` (those of ``HELD`` in its ``holder``)."""
    e: dict[str, Any] = {
        "version": 3,
        "holder": {"pid": pid, "live": 0, "cached": 0, "soft_share": None, "hard_limit": None,
                   "idle": False, "asleep": 0},
        "pid_ns": ns, "started": started, "name": "fake", "total": total,
        "hard_limit_from": "", "waiting": 0, "updated": time.time(), "history": [],
    }
    update(e, **fields)
    return e


def update(e: dict[str, Any], **fields: Any) -> None:
    """Sets ``fields`` of entry ``e`` (those of ``HELD`` in its ``holder``)."""
    for k, v in fields.items():
        (e["holder"] if k in HELD else e)[k] = v

MAX_MESSAGE = 2048


def identity() -> tuple[int, int, int]:
    """This process's pid, pid namespace and start time (as rrmm reads them)."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    with open("/proc/self/stat") as f:
        stat = f.read()
    started = int(stat[stat.rfind(")") + 1:].split()[19])
    return os.getpid(), ns, started


class Fake:
    def __init__(self, directory: str, total: int) -> None:
        self.directory, self.total = directory, total
        self.pid, self.ns, self.started = identity()
        self.entry = entry(self.pid, self.ns, self.started, total)
        self.mode: dict[str, Any] = {"answer": "honest"}
        self.requests: list[dict[str, Any]] = []
        self.answers: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.path = os.path.join(directory, f"{self.pid}-{self.ns}.sock")
        assert len(self.path) < 100, self.path
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.write_entry()
        threading.Thread(target=self.listen, daemon=True).start()

    def write_entry(self, **fields: Any) -> None:
        with self.lock:
            update(self.entry, **fields, updated=time.time())
            name = os.path.join(self.directory, f"{self.pid}-{self.ns}.json")
            tmp = os.path.join(self.directory, f".{self.pid}-{self.ns}.json.tmp")
            with open(tmp, "w") as f:
                json.dump(self.entry, f)
            os.rename(tmp, name)

    def listen(self) -> None:
        while True:
            data, address = self.sock.recvfrom(MAX_MESSAGE + 1)
            try:
                message = json.loads(data)
            except ValueError:
                continue
            if message.get("op") == "answer":
                self.answers[message["id"]] = message
                continue
            self.requests.append(message)
            threading.Thread(target=self.answer, args=(message, address), daemon=True).start()

    def answer(self, request: dict[str, Any], address: str) -> None:
        mode = dict(self.mode)
        time.sleep(float(mode.get("delay", 0)))
        how = mode["answer"]
        if how == "silent":
            return
        given = int(self.entry["holder"]["cached"])
        if how == "claim":
            self.write_entry(**mode.get("after", {}))
            given = int(mode["given"])
        else:
            self.write_entry(cached=0)
        answer = {"op": "answer", "id": request["id"], "from": self.pid, "given": given,
                  "note": ""}
        if how == "unknown_id":
            answer["id"] = 2**64 - 1
        if how == "other_sender":
            child = os.fork()
            if child == 0:
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    s.sendto(json.dumps(answer).encode(), address)
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
            return
        try:
            self.sock.sendto(json.dumps(answer).encode(), address)
        except OSError:
            pass

    def flood(self, path: str, n: int, op: str, never_read: bool) -> dict[str, Any]:
        sender = self.sock
        if never_read:
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            quiet = os.path.join(self.directory, f"quiet-{self.pid}.sock")
            if os.path.exists(quiet):
                os.unlink(quiet)
            sender.bind(quiet)
            self.quiet = sender  # kept open, never read
        started = time.monotonic()
        for i in range(n):
            # Named as sent by another process: the answer must go where it came from.
            message = {"op": op, "id": 10_000 + i, "from": 1, "bytes": 1 << 20}
            sender.sendto(json.dumps(message).encode(), path)
        return {"sent": n, "seconds": time.monotonic() - started}

    def probe(self, path: str, wait: float) -> dict[str, Any]:
        started = time.monotonic()
        self.sock.sendto(json.dumps({"op": "give", "id": 7, "from": self.pid, "bytes": 1}).encode(),
                         path)
        while time.monotonic() - started < wait:
            if 7 in self.answers:
                return {"answered": True, "note": self.answers.pop(7)["note"],
                        "seconds": time.monotonic() - started}
            time.sleep(0.005)
        return {"answered": False, "seconds": time.monotonic() - started}


def main() -> None:
    fake = Fake(sys.argv[1], int(sys.argv[2]))
    print(json.dumps({"pid": fake.pid, "ns": fake.ns, "socket": fake.path}), flush=True)
    for line in sys.stdin:
        cmd, _, rest = line.strip().partition(" ")
        out: Any = True
        if cmd == "entry":
            fake.write_entry(**json.loads(rest))
        elif cmd == "mode":
            fake.mode = json.loads(rest)
        elif cmd == "requests":
            out = fake.requests
        elif cmd == "send":
            path, data = rest.split(" ", 1)
            fake.sock.sendto(bytes.fromhex(data), path)
        elif cmd == "flood":
            path, n, op, *never = rest.split()
            out = fake.flood(path, int(n), op, bool(never))
        elif cmd == "probe":
            path, wait = rest.split()
            out = fake.probe(path, float(wait))
        elif cmd == "exit":
            break
        else:
            out = {"error": f"unknown command {cmd}"}
        print(json.dumps(out), flush=True)
    os.unlink(fake.path)
    os.unlink(os.path.join(fake.directory, f"{fake.pid}-{fake.ns}.json"))


if __name__ == "__main__":
    main()
