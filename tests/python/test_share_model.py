"""A shared pool against a model (issue 49), generated: a shareable expandable pool on host
memory (a memory file per page, the CPU stand-in for a device's shareable pages), published,
with importers that attach, read, release and die, and peers that send what is no request and
hang up or stay silent, interleaved with the pool's own movers: frees
(deferred while an importer holds the block), trims (exported pages kept) and sleeps (refused
while an importer is attached; with none, attaching is refused until the wake, and importers
attach again afterwards to the same names and bytes). After every step every live block and
every array an importer holds read their own bytes, and the deferred frees are the blocks freed
while held."""

from __future__ import annotations

import ctypes
import socket
import tempfile
import time
from typing import Any

import numpy as np
import pytest
import rrmm
import rrmm.mr
import rrmm.share
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

PAGE = 2 << 20


def _bytes_of(ptr: int, nbytes: int) -> bytes:
    return ctypes.string_at(ptr, nbytes)


def _pattern(seed: int, nbytes: int) -> bytes:
    return (np.arange(nbytes, dtype=np.uint32) * 2654435761 + seed).astype(np.uint8).tobytes()


class ShareMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = rrmm.mr.ExpandableMemoryResource(
            pageable_host=True,
            device_capacity=64 << 20,
            reserve_size=64 << 20,
            page_size=PAGE,
            shareable=True,
        )
        self.pub = self.pool.publish("model", directory=tempfile.mkdtemp(prefix="rs"))
        self.seed = 1
        #: Live blocks of the exporter: name -> (buffer, bytes it holds, where the name starts).
        self.live: dict[str, tuple[Any, bytes, int]] = {}
        #: Blocks the exporter freed while an importer held them: name -> bytes.
        self.freed_held: dict[str, bytes] = {}
        #: Importers: each holds arrays by name.
        self.importers: list[tuple[Any, dict[str, Any]]] = []
        self.slept = 0
        #: Lying peers that stay connected (closed at teardown).
        self.liars: list[socket.socket] = []
        #: A block was named: its pages are exported (kept until the publication closes).
        self.named_any = False
        #: An importer closed since the last check: its leases go when the exporter sees it.
        self.settling = False

    def _figures(self) -> dict[str, int]:
        figures = self.pool.share_figures()
        assert figures is not None, "a shareable pool has share figures"
        return figures

    def _holders(self, name: str) -> int:
        return sum(name in held for _, held in self.importers)

    @rule(nbytes=st.integers(1, 3 * PAGE), skip=st.integers(0, 3 * PAGE))
    def allocate_and_name(self, nbytes: int, skip: int) -> None:
        """A block, named from its start or (a view) from ``skip`` bytes into it."""
        try:
            buf = rrmm.DeviceBuffer(size=nbytes, mr=self.pool)
        except MemoryError:
            return
        data = _pattern(self.seed, nbytes)
        ctypes.memmove(buf.ptr, data, nbytes)
        name = f"b{self.seed}"
        self.seed += 1
        skip %= nbytes
        self.pub.share(name, buf.ptr + skip, nbytes=nbytes - skip)
        self.live[name] = (buf, data, skip)
        self.named_any = True

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 1 << 16), held_first=st.booleans())
    def exporter_frees(self, pick: int, held_first: bool) -> None:
        held = sorted(n for n in self.live if self._holders(n))
        names = held if held_first and held else sorted(self.live)
        name = names[pick % len(names)]
        _, data, skip = self.live.pop(name)  # the DeviceBuffer is dropped: its free
        if self._holders(name):
            self.freed_held[name] = data[skip:]

    @precondition(lambda self: len(self.importers) < 3)
    @rule()
    def attach(self) -> None:
        self.importers.append((rrmm.share.attach(self.pub.path), {}))

    @precondition(lambda self: self.live and self.importers)
    @rule(who=st.integers(0, 2), pick=st.integers(0, 1 << 16))
    def importer_reads(self, who: int, pick: int) -> None:
        imp, held = self.importers[who % len(self.importers)]
        name = sorted(self.live)[pick % len(self.live)]
        held[name] = imp.get(name)

    @precondition(lambda self: any(held for _, held in self.importers))
    @rule(who=st.integers(0, 2), dies=st.booleans())
    def importer_lets_go(self, who: int, dies: bool) -> None:
        imp, held = self.importers[who % len(self.importers)]
        if dies:
            imp.close()
            self.importers.remove((imp, held))
            self.settling = True
        else:
            imp.release(sorted(held))
            held.clear()
            self.settling = True  # the exporter runs a free it let go of after its answer
        for name in [n for n in self.freed_held if not self._holders(n)]:
            del self.freed_held[name]

    @rule(data=st.binary(max_size=96), stays=st.booleans())
    def a_peer_lies(self, data: bytes, stays: bool) -> None:
        """A process of the same user connects and sends bytes that are no request (or a
        truncated, replayed one), then hangs up or stays silent: the exporter answers with a
        refusal or nothing and serves the others on; nothing it holds moves."""
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            peer.settimeout(1)
            peer.connect(self.pub.path)
            peer.send(data or b"\0")
            if stays:
                self.liars.append(peer)  # attached, silent: a sleep must be refused now
                return
        except OSError:
            pass  # refused at the door (a sleeping exporter, a full house): also fine
        peer.close()
        self.settling = True

    @precondition(lambda self: self.importers)
    @rule()
    def every_importer_closes(self) -> None:
        """All at once (so that the pool can sleep): every deferred free runs."""
        for imp, _ in self.importers:
            imp.close()
        self.importers.clear()
        self.freed_held.clear()
        self.settling = True

    @initialize()
    def first_importer(self) -> None:
        self.importers.append((rrmm.share.attach(self.pub.path), {}))

    @rule(sleeps=st.booleans())
    def pool_moves(self, sleeps: bool) -> None:
        """The pool's own movers: a trim (exported pages kept) or a sleep and wake."""
        if not sleeps:
            self.pool.trim(0)
            return
        if (self.importers or self.liars) and self.named_any:
            # An importer attached may map the exported pages: the sleep is refused.
            with pytest.raises(RuntimeError, match="importers are attached"):
                self.pool.offload()
            return
        deadline = time.monotonic() + 5
        while not self.importers and not self.liars and self._figures()["importers"]:
            # A closed importer's socket, on its way out.
            assert time.monotonic() < deadline, self._figures()
            time.sleep(0.005)
        self.pool.offload()
        if self.named_any:
            with pytest.raises(RuntimeError, match="sleeps"):
                rrmm.share.attach(self.pub.path)  # taken again at the wake, not before
        self.pool.restore()
        self.slept += 1

    @invariant()
    def every_byte_where_it_belongs(self) -> None:
        for buf, data, _ in self.live.values():
            assert _bytes_of(buf.ptr, len(data)) == data
        for _, held in self.importers:
            for name, array in held.items():
                if name in self.live:
                    _, data, skip = self.live[name]
                    want = data[skip:]
                else:
                    want = self.freed_held[name]
                assert _bytes_of(array.ptr, array.nbytes) == want, name

    @invariant()
    def deferred_frees_are_the_blocks_freed_while_held(self) -> None:
        # After a release or a close the exporter's frees may still be on their way (it runs
        # them after its answer); otherwise the count is exact at once.
        want = len(self.freed_held)
        deadline = time.monotonic() + (5 if self.settling else 0)
        while self._figures()["deferred_free_blocks"] != want:
            assert time.monotonic() < deadline, (self._figures(), want)
            time.sleep(0.005)
        self.settling = False

    def teardown(self) -> None:
        for peer in self.liars:
            peer.close()
        for imp, _ in self.importers:
            imp.close()
        self.pub.close()


TestShareMachine = ShareMachine.TestCase
TestShareMachine.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
