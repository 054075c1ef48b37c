"""Issue 46: memory that moves has one owner. Every mover of rrmm, interleaved, against a model,
with every byte checked after every step, on the CPU with real bytes.

The setup is what ``rrmm.compat`` builds: a ``TaggedMemoryResource`` as the device's resource,
its first pool for memory outside every region, a pool per region tag, each an expandable pool
on plain host memory that pretends to be a small device and spills beyond it (real bytes), and
a ``PoolMemoryResource`` built over the tagged resource before most tags exist. The actors:

- the main thread (Hypothesis rules): allocations in and outside regions and through the pool
  over the tagged resource (tags added late), frees, rrmm's copies in and raw writes (as a
  kernel would, only while the process is busy), the engine's pause and resume (a host copy, files in a
  directory, or no backup), the user's sleep and restore of a pool, promotion, trims, the host's room running
  out and coming back, idle and busy declarations;
- the shared-GPU ledger's worker thread, asked by a peer process (``shared_gpu_fake_peer.py``)
  to put this process to sleep while it is idle (it answers concurrently with the main thread's
  steps; a sleep of an idle process wakes when its memory is used, and a declaration of busy
  abandons or undoes it);
- a reader thread that copies live buffers out with rrmm's copies all along, concurrently with
  every transition, and checks their bytes;
- a published pool (issue 49): one more tag of the tagged resource, a shareable expandable pool
  (so the ledger's sleep reaches it by construction), whose blocks are named and mapped by
  importers that attach, hold, release and close, and peers that send what is no request; the
  user's sleep and the ledger's are refused while an importer is attached and its frees wait
  for the importers.

Rules draw their arguments whatever the state (no preconditions: the other actors make the
outcomes of steps vary from run to run, and what is drawn must not). Checked after every step:
every live buffer's bytes, and every array an importer holds (through rrmm's copies, which wake a pool
asleep for the ledger and are refused for a pool asleep by its user); nothing of a busy process
sleeps for the ledger; a refused transition changed nothing; a pool over the tagged resource
refuses to hand out memory while a pool below sleeps; the reader saw no wrong byte.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rrmm
import rrmm.share
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from rrmm import _rrmm, mr
from rrmm._rrmm import _clear_per_device_resources
from rrmm.compat._tag_pools import OUTSIDE
from rrmm.compat.torch_memory_saver import TorchMemorySaver

MiB = 1 << 20
PAGE = 2 * MiB
DEVICE_PAGES = 6
SPILL_PAGES = 16
#: Region tags and what their pause keeps: a host copy ("cpu"), nothing ("none"), or files
#: in a directory ("disk").
TAGS = {"weights": "cpu", "kv_cache": "none", "graphs": "cpu", "offline": "disk"}
#: The tag of the published pool (added to the tagged resource by hand: no region enters it).
SHARED = "shared"


def spilling_pool() -> mr.ExpandableMemoryResource:
    return mr.ExpandableMemoryResource(
        reserve_size=64 * PAGE,
        page_size=PAGE,
        pageable_host=True,
        device_capacity=DEVICE_PAGES * PAGE,
        spill_to_host=SPILL_PAGES * PAGE,
    )


def pattern(size: int, seed: int) -> bytes:
    arr = ((np.arange(size, dtype=np.uint32) * 2654435761 + seed) >> 9).astype(np.uint8)
    return arr.tobytes()


@dataclass(eq=False)
class Buf:
    buf: Any  # the rrmm.DeviceBuffer; None once freed (an importer may still hold its name)
    tag: str  # the pool it lives in: a region tag or OUTSIDE
    data: bytes | None  # None: undefined (a pause without a backup dropped it)


FAKE_PEER = Path(__file__).with_name("shared_gpu_fake_peer.py")


class LedgerPeer:
    """A peer process on the same ledger (``shared_gpu_fake_peer.py``) that asks this process
    to sleep: the member's worker thread answers, concurrently with the machine's steps."""

    def __init__(self, directory: str, total: int) -> None:
        self.proc = subprocess.Popen([sys.executable, str(FAKE_PEER), directory, str(total)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self.read()
        self.next_id = 1

    def read(self) -> Any:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def command(self, line: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.read()

    def ask_to_sleep(self, socket_path: str, nbytes: int) -> None:
        self.next_id += 1
        message = {"op": "sleep", "id": self.next_id, "from": self.info["pid"], "bytes": nbytes}
        self.command(f"send {socket_path} {json.dumps(message).encode().hex()}")

    def close(self) -> None:
        try:
            self.command("exit")
        except (OSError, ValueError):
            pass
        self.proc.kill()
        self.proc.wait()


class Reader:
    """A thread that reads live buffers with rrmm's copies all along and checks them."""

    def __init__(self, machine: MoversMachine) -> None:
        self.machine = machine
        self.failures: list[str] = []
        self.reads = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        m = self.machine
        i = 0
        while not self.stop.is_set():
            with m.lock:
                live = list(m.live)
                if not live:
                    pass
                else:
                    b = live[i % len(live)]
                    i += 1
                    try:
                        got = b.buf.tobytes()
                    except RuntimeError as e:
                        if "asleep" not in str(e):
                            self.failures.append(f"read refused oddly: {e}")
                    else:
                        self.reads += 1
                        if b.data is not None and got != b.data:
                            self.failures.append(f"wrong bytes in {b.tag} at {b.buf.ptr:#x}")
            self.stop.wait(0.0005)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


class MoversMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()
        self.live: list[Buf] = []
        self.seed = 0
        self.paused: set[str] = set()  # region tags paused by the engine (the user)
        self.user_asleep: set[str] = set()  # pools the user offloaded directly
        self.entered: set[str] = set()
        self.room_capped = False
        self.is_idle = False
        #: Importers of the published pool: each holds arrays by name, with the buffer named.
        self.importers: list[tuple[Any, dict[str, tuple[Any, Buf]]]] = []

    @initialize()
    def build(self) -> None:
        self.saver = TorchMemorySaver(make_pool=spilling_pool)
        self.disk_dir = tempfile.mkdtemp(prefix="rrmm-movers-disk-")
        self.saver.set_disk_backup_dir(self.disk_dir)
        with self.saver.region(tag="weights", enable_cpu_backup=True):
            pass
        self.entered.add("weights")
        self.tagged = mr.get_current_device_resource()
        assert isinstance(self.tagged, mr.TaggedMemoryResource)
        # Built before the other tags exist: it sees them through its live link.
        self.over = mr.PoolMemoryResource(self.tagged, 0)
        # The ledger: this process above its share (1 byte), and a peer that asks it to sleep.
        self.ledger_dir = tempfile.mkdtemp(prefix="rrmm-movers-")
        os.chmod(self.ledger_dir, 0o700)
        rrmm.shared_gpu.join(self.tagged, soft_share=1, directory=self.ledger_dir,
                             device_key="movers")
        status = rrmm.shared_gpu.status(self.tagged)
        assert status is not None
        self.socket = status["socket"]
        total = rrmm.shared_gpu.processes(self.tagged)[0].total
        self.peer = LedgerPeer(os.path.join(self.ledger_dir, "movers"), total)
        # The published pool: a tag of the tagged resource, so the ledger's sleeps reach it.
        self.shared_pool = mr.ExpandableMemoryResource(
            reserve_size=32 * PAGE,
            page_size=PAGE,
            pageable_host=True,
            device_capacity=DEVICE_PAGES * PAGE,
            shareable=True,
        )
        self.tagged.add_tag(SHARED, self.shared_pool)
        self.share_dir = tempfile.mkdtemp(prefix="rs")
        self.publication = self.shared_pool.publish("movers", directory=self.share_dir)
        self.names: dict[str, Buf] = {}
        # One named block and an importer holding it from the start: every run interleaves
        # the other movers with a held, published pool (the rules let it go and attach more).
        self.share_a_buffer(PAGE + 123)
        self.importer_attaches_and_reads(pick=1, count=1)
        assert self.importers and self.importers[0][1], "the first importer holds a name"
        self.reader = Reader(self)

    def teardown(self) -> None:
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.close()
        peer = getattr(self, "peer", None)
        if peer is not None:
            peer.close()
        for imp, _ in getattr(self, "importers", []):
            imp.close()
        if hasattr(self, "publication"):
            self.publication.close()
            shutil.rmtree(self.share_dir, ignore_errors=True)
        if hasattr(self, "tagged"):
            rrmm.shared_gpu.leave(self.tagged)
            shutil.rmtree(self.ledger_dir, ignore_errors=True)
        if hasattr(self, "disk_dir"):
            shutil.rmtree(self.disk_dir, ignore_errors=True)
        _rrmm._host_pages_set_room_cap(None)
        with self.lock:
            self.live.clear()
        _clear_per_device_resources()

    # ------------------------------------------------------------------ model helpers

    def asleep(self, tag: str) -> bool:
        return tag in self.paused or tag in self.user_asleep

    def anything_asleep(self) -> bool:
        return bool(self.paused or self.user_asleep)

    def region(self, tag: str) -> Any:
        """A region of ``tag`` with its backup (see ``TAGS``)."""
        kind = TAGS[tag]
        return self.saver.region(tag=tag, enable_cpu_backup=kind == "cpu",
                                 enable_disk_backup=kind == "disk")

    def pool(self, tag: str) -> mr.ExpandableMemoryResource:
        return self.tagged.pool(tag)

    def tags(self) -> list[str]:
        """Every pool's tag in use: the regions entered, outside, the published pool."""
        return [OUTSIDE, *sorted(self.entered), SHARED]

    def next_data(self, size: int) -> bytes:
        self.seed += 1
        return pattern(size, self.seed)

    # ------------------------------------------------------------------ allocations

    @rule(size=st.integers(1, 3 * PAGE), where=st.sampled_from([OUTSIDE, *TAGS]))
    def allocate(self, size: int, where: str) -> None:
        data = self.next_data(size)
        try:
            if where == OUTSIDE:
                buf = rrmm.DeviceBuffer.to_device(data)
            else:
                with self.region(where):
                    buf = rrmm.DeviceBuffer.to_device(data)
                self.entered.add(where)
        except RuntimeError as e:
            # A sleep for the ledger that cannot wake without host room refuses too.
            assert "asleep" in str(e) and (self.asleep(where) or self.room_capped), e
            return
        except MemoryError:
            return  # the pretend device and its spill are full, or the host is
        assert not self.asleep(where), f"{where} is asleep yet served an allocation"
        with self.lock:
            self.live.append(Buf(buf, where, data))

    @rule(size=st.integers(1, PAGE), where=st.sampled_from([OUTSIDE, *TAGS]))
    def allocate_over_the_tagged_resource(self, size: int, where: str) -> None:
        """A pool built over the tagged resource before the tag existed: it refuses while any
        pool below sleeps (its cached chunks may lie there)."""
        data = self.next_data(size)
        region: Any = self.region(where) if where != OUTSIDE else _nullcontext()
        try:
            with region:
                buf = rrmm.DeviceBuffer.to_device(data, mr=self.over)
        except RuntimeError as e:
            assert "asleep" in str(e), e
            assert self.anything_asleep() or self.room_capped, e
            return
        except MemoryError:
            return
        if where != OUTSIDE:
            self.entered.add(where)
        assert not self.anything_asleep(), "served over a sleeping pool"
        assert buf.tobytes() == data
        del buf

    @rule(i=st.integers(0, 1 << 16))
    def free(self, i: int) -> None:
        with self.lock:
            if not self.live:
                return
            b = self.live.pop(i % len(self.live))
            b.buf = None  # frees are allowed while asleep (an importer's record keeps the model)

    @rule(i=st.integers(0, 1 << 16))
    def write_with_a_copy(self, i: int) -> None:
        with self.lock:
            if not self.live:
                return
            b = self.live[i % len(self.live)]
            data = self.next_data(b.buf.size)
            try:
                b.buf.copy_from_host(np.frombuffer(data, dtype=np.uint8))
            except RuntimeError as e:
                assert "asleep" in str(e) and (self.asleep(b.tag) or self.room_capped), e
                return
            assert not self.asleep(b.tag)
            b.data = data

    @rule(i=st.integers(0, 1 << 16))
    def write_raw(self, i: int) -> None:
        """A kernel's write: only on awake memory of a busy process (the contract)."""
        with self.lock:
            if not self.live or self.idle():
                return
            b = self.live[i % len(self.live)]
            if self.asleep(b.tag):
                return
            data = self.next_data(b.buf.size)
            ctypes.memmove(b.buf.ptr, data, len(data))
            b.data = data

    # ------------------------------------------------------------------ the user's movers

    @rule(pick=st.integers(0, 1 << 16))
    def engine_pause(self, pick: int) -> None:
        tags = sorted(self.entered - self.paused - self.user_asleep)
        if not tags:
            return
        tag = tags[pick % len(tags)]
        if TAGS[tag] == "none":
            with self.lock:  # no backup: its bytes are undefined from here on
                for b in self.live:
                    if b.tag == tag:
                        b.data = None
        try:
            self.saver.pause(tag)
        except MemoryError:
            assert self.room_capped, "a pause refused with room on the host"
            assert not self.pool(tag).asleep, "a refused pause changed nothing"
            return
        self.paused.add(tag)
        self.is_idle = True  # an engine between phases is idle on its shared GPU
        assert self.pool(tag).asleep
        assert self.pool(tag).movement()[0]["cause"] == "user"

    @rule(pick=st.integers(0, 1 << 16))
    def engine_resume(self, pick: int) -> None:
        if not self.paused:
            return
        tag = sorted(self.paused)[pick % len(self.paused)]
        try:
            self.saver.resume(tag)
        except MemoryError:
            assert self.room_capped, "a wake refused with room on the host"
            assert self.pool(tag).asleep, "a refused wake keeps the data asleep on the host"
            return
        self.paused.discard(tag)
        self.is_idle = False  # and busy again when it resumes
        assert not self.pool(tag).asleep

    @rule(where=st.sampled_from([OUTSIDE, *TAGS]))
    def user_sleep_and_restore_of_a_pool(self, where: str) -> None:
        if where != OUTSIDE and where not in self.entered:
            return
        pool = self.pool(where)
        if self.asleep(where):
            with pytest.raises(RuntimeError, match="asleep already"):
                pool.offload()
            return
        try:
            pool.offload()
        except MemoryError:
            assert self.room_capped
            assert not pool.asleep, "a refused sleep changed nothing"
            return
        self.user_asleep.add(where)
        assert pool.movement()[0]["phase"] == "asleep"

    @rule(pick=st.integers(0, 1 << 16))
    def user_restore(self, pick: int) -> None:
        if not self.user_asleep:
            return
        where = sorted(self.user_asleep)[pick % len(self.user_asleep)]
        try:
            self.pool(where).restore()
        except MemoryError:
            assert self.room_capped and self.pool(where).asleep
            return
        self.user_asleep.discard(where)

    @rule(where=st.sampled_from([OUTSIDE, *TAGS]), limit=st.none() | st.integers(1, 4 * PAGE))
    def promote(self, where: str, limit: int | None) -> None:
        if where != OUTSIDE and where not in self.entered:
            return
        pool = self.pool(where)
        before = pool.spilled_bytes()
        try:
            report = pool.promote(max_bytes=limit)
        except RuntimeError as e:
            assert "asleep" in str(e) and (self.asleep(where) or self.room_capped), e
            return
        except MemoryError as e:
            assert self.room_capped and "nothing was moved" in str(e), e
            assert pool.spilled_bytes() == before, "a refused promotion moved nothing"
            return
        assert not self.asleep(where)
        assert report["spilled"] == pool.spilled_bytes() <= before

    @rule(where=st.sampled_from([OUTSIDE, *TAGS]),
          when=st.sampled_from(["safe_points", "frees", "off"]))
    def auto_promote(self, where: str, when: str) -> None:
        """When spilled pages move back on their own: at safe points, also at frees (the
        model's frees then promote, beside the reader's copies and the ledger's peer), or
        never."""
        if where == OUTSIDE or where in self.entered:
            self.pool(where).auto_promote = when

    @rule(where=st.sampled_from([OUTSIDE, *TAGS]))
    def at_rest(self, where: str) -> None:
        if where != OUTSIDE and where not in self.entered:
            return
        pool = self.pool(where)
        before = pool.spilled_bytes()
        try:
            report = rrmm.at_rest(pool)
        except MemoryError as e:
            assert self.room_capped and "nothing was moved" in str(e), e
            assert pool.spilled_bytes() == before, "a refused promotion moved nothing"
            return
        assert report["promoted"] <= before
        if pool.auto_promote == "off":
            assert report["promoted"] == 0

    @rule(where=st.sampled_from([OUTSIDE, *TAGS]))
    def trim(self, where: str) -> None:
        if where == OUTSIDE or where in self.entered:
            self.pool(where).trim()

    @rule(capped=st.booleans())
    def host_room(self, capped: bool) -> None:
        """The host's room runs out (or comes back): sleeps that need new host pages and
        promotions are refused, and change nothing."""
        if capped:
            rrmm.host_pages.give_back()
        _rrmm._host_pages_set_room_cap(0 if capped else None)
        self.room_capped = capped
        if not capped and not self.is_idle:
            # What could not wake for want of room wakes at the next declaration of busy.
            rrmm.shared_gpu.declare_busy(self.tagged)

    # ------------------------------------------------------------------ the published pool

    @rule(size=st.integers(1, 2 * PAGE))
    def share_a_buffer(self, size: int) -> None:
        """A block of the published pool, named (refused while the pool sleeps: the block
        stays unnamed)."""
        data = self.next_data(size)
        try:
            buf = rrmm.DeviceBuffer.to_device(data, mr=self.shared_pool)
        except RuntimeError as e:
            assert "asleep" in str(e) and (self.asleep(SHARED) or self.room_capped), e
            return
        except MemoryError:
            return
        b = Buf(buf, SHARED, data)
        with self.lock:
            self.live.append(b)
        name = f"n{self.seed}"
        try:
            self.publication.share(name, buf.ptr, nbytes=size)
        except RuntimeError as e:
            # Asleep (the user's, or the ledger's of an idle process) between the two.
            assert "sleeps" in str(e) and (self.asleep(SHARED) or self.idle()), e
            return
        self.names[name] = b

    @rule(pick=st.integers(0, 1 << 16), count=st.integers(1, 4))
    def importer_attaches_and_reads(self, pick: int, count: int) -> None:
        """A new importer (at most 2), or the first one, takes names: refused while the pool
        sleeps (attach again once it wakes)."""
        if not self.names:
            return
        live = [n for n, b in self.names.items() if b in self.live]
        if not live:
            return
        if len(self.importers) < 2 and pick % 2:
            try:
                imp = rrmm.share.attach(self.publication.path)
            except RuntimeError as e:
                assert "sleeps" in str(e), e
                assert self.asleep(SHARED) or self.idle(), "refused while awake"
                return
            self.importers.append((imp, {}))
        elif not self.importers:
            return
        imp, held = self.importers[pick % len(self.importers)]
        chosen = sorted({live[(pick + k) % len(live)] for k in range(count)})
        try:
            arrays = imp.get_many(chosen)
        except (RuntimeError, OSError) as e:
            raise AssertionError(f"an attached importer could not resolve {chosen}: {e}") from e
        for name, array in zip(chosen, arrays):
            held[name] = (array, self.names[name])

    @rule(pick=st.integers(0, 1 << 16), close=st.booleans())
    def importer_lets_go(self, pick: int, close: bool) -> None:
        if not self.importers:
            return
        imp, held = self.importers[pick % len(self.importers)]
        if close:
            imp.close()
            self.importers.remove((imp, held))
        else:
            imp.release(sorted(held))
            held.clear()

    @rule(pick=st.integers(0, 1 << 16))
    def exporter_frees_a_held_block_and_allocates_again(self, pick: int) -> None:
        """The exporter drops a block an importer holds and at once asks its pool for as
        much again, writing it: the held block is not reused (its free waits for the
        importers), so the importer reads on what it held."""
        held = [b for _, h in self.importers for _, b in h.values() if b in self.live]
        if not held:
            return
        b = held[pick % len(held)]
        with self.lock:
            self.live.remove(b)
            size = b.buf.size
            b.buf = None  # the exporter's last reference: its free (the importer's record stays)
        data = self.next_data(size)
        try:
            again = rrmm.DeviceBuffer.to_device(data, mr=self.shared_pool)
        except RuntimeError as e:
            assert "asleep" in str(e) and (self.asleep(SHARED) or self.room_capped), e
            return
        except MemoryError:
            return
        with self.lock:
            self.live.append(Buf(again, SHARED, data))

    @rule(data=st.binary(max_size=64))
    def a_share_peer_lies(self, data: bytes) -> None:
        """A process of the same user connects to the publication, sends bytes that are no
        request, and hangs up: the exporter refuses it (or refused it at the door, asleep) and
        serves on; nothing moves."""
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            peer.settimeout(1)
            peer.connect(self.publication.path)
            peer.send(data or b"\0")
        except OSError:
            pass
        finally:
            peer.close()

    @rule()
    def user_sleeps_the_published_pool(self) -> None:
        """Refused while an importer is attached to a pool with names; otherwise it sleeps
        (attaches refused until the wake, ``user_restore``)."""
        if self.asleep(SHARED):
            return
        if not self.importers:
            # A closed importer's (or a lying peer's) socket, on its way out: the exporter
            # counts it until its thread sees the hang-up.
            deadline = time.monotonic() + 10
            while (self.shared_pool.share_figures() or {}).get("importers"):
                assert time.monotonic() < deadline, self.shared_pool.share_figures()
                time.sleep(0.005)
        try:
            self.shared_pool.offload()
        except RuntimeError as e:
            assert "importers are attached" in str(e) and self.importers, e
            return
        except MemoryError:
            assert self.room_capped
            return
        self.user_asleep.add(SHARED)

    # ------------------------------------------------------------------ the ledger

    def idle(self) -> bool:
        return self.is_idle

    @rule()
    def declare_idle(self) -> None:
        rrmm.shared_gpu.declare_idle(self.tagged)
        self.is_idle = True

    @rule(nbytes=st.integers(1, 64 * PAGE))
    def ledger_asks_to_sleep(self, nbytes: int) -> None:
        """A peer asks: the worker thread sleeps this idle process's pools meanwhile (or
        declines, busy), concurrently with the next steps."""
        self.peer.ask_to_sleep(self.socket, nbytes)

    @rule()
    def declare_busy(self) -> None:
        """Returns only once the ledger's sleep in flight is done or abandoned and nothing
        sleeps for the ledger: a kernel may run on any awake buffer at once."""
        try:
            rrmm.shared_gpu.declare_busy(self.tagged)
        except MemoryError:
            assert self.room_capped, "a wake refused with room on the host"
            self.is_idle = False
            return
        self.is_idle = False
        for tag in self.tags():
            (state,) = self.pool(tag).movement()
            assert state["cause"] != "ledger", (tag, state)
            if not self.asleep(tag):
                assert state["phase"] == "awake", (tag, state)
        with self.lock:
            for b in self.live:
                if not self.asleep(b.tag) and b.data is not None:
                    got = ctypes.string_at(b.buf.ptr, b.buf.size)
                    assert got == b.data, f"wrong bytes in {b.tag} right after busy"

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_byte_is_where_the_model_says(self) -> None:
        if not hasattr(self, "tagged"):
            return
        with self.lock:
            live = list(self.live)
        for b in live:
            try:
                got = b.buf.tobytes()
            except RuntimeError as e:
                assert "asleep" in str(e) and (self.asleep(b.tag) or self.room_capped), (b.tag, e)
                continue
            assert not self.asleep(b.tag), f"{b.tag} is asleep, yet its bytes were copied"
            if b.data is not None:
                assert got == b.data, f"wrong bytes in {b.tag} at {b.buf.ptr:#x}"
        assert not self.reader.failures, self.reader.failures[:3]
        for _, held in self.importers:
            for name, (array, b) in held.items():
                if b.data is not None:  # the importer maps the exporter's memory itself
                    got = ctypes.string_at(array.ptr, array.nbytes)
                    assert got == b.data, f"an importer reads wrong bytes in {name}"

    @invariant()
    def the_pools_state_is_the_models(self) -> None:
        if not hasattr(self, "tagged"):
            return
        for tag in self.tags():
            (state,) = self.pool(tag).movement()
            if self.asleep(tag):
                assert state["phase"] == "asleep" and state["cause"] == "user", (tag, state)
            elif not self.idle() and not self.room_capped:
                assert state["phase"] == "awake", (tag, state)
            else:
                assert state["cause"] in (None, "ledger"), (tag, state)
            assert state["spilled_bytes"] == self.pool(tag).spilled_bytes()
            assert state["device_bytes"] <= DEVICE_PAGES * PAGE


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


TestMoversMachine = MoversMachine.TestCase
TestMoversMachine.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
