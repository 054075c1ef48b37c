"""torch_memory_saver 0.0.10's API (rrmm.compat.torch_memory_saver) against a model of its
documented behaviour, on plain host memory with real bytes (``rrmm.DeviceBuffer`` stands for the
tensors: it allocates from the current device resource, as PyTorch's allocator does through
rrmm's hook).

- A Hypothesis state machine: regions by tag with no backup, a CPU backup (pinned, mmap, the
  default from ``TMS_INIT_CPU_BACKUP_BACKEND``) or a disk backup (real files); regions nested and
  on another thread at the same time; ``disable()``; pause and resume by tag and of every tag,
  with their refusals; ``retain_cpu_backup`` on and off (and ``TMS_RETAIN_CPU_BACKUP``);
  ``get_cpu_backup`` while paused (the bytes at the pause), after a retaining resume (the same),
  and otherwise (None). Checked after every step: every byte of every buffer whose contents are
  defined, a paused pool holds no device memory, the disk backup directory holds exactly the
  paused disk tags' bytes, and each pool's count of backing changes.
- Disk backups with real files: the round trip in chunks, a full disk (a file size limit, and a
  tiny tmpfs where this machine lets a test mount one), a missing directory, a file that
  vanished or shrank before the resume.
- ``TMS_INIT_ENABLE`` and its companions in fresh interpreters.
- The first pause of a region with a CPU backup finds its host pages made while it grew; the
  pool's watcher of backing changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from typing import Any

import numpy as np
import pytest
import rrmm
from conftest import run_fresh
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from rrmm import _rrmm, mr
from rrmm._rrmm import _clear_per_device_resources
from rrmm.compat._tag_pools import OUTSIDE
from rrmm.compat.torch_memory_saver import TorchMemorySaver

PAGE = 2 << 20
TAGS = ["kv", "weights", "graph"]
#: A region's backup arguments: (enable_cpu_backup, enable_disk_backup, cpu_backup_backend).
BACKUPS: list[tuple[bool, bool, str | None]] = [
    (False, False, None), (True, False, None), (True, False, "pinned"), (True, False, "mmap"),
    (False, True, None)]
TMS_VARIABLES = ("TMS_RETAIN_CPU_BACKUP", "TMS_INIT_CPU_BACKUP_BACKEND", "TMS_DISK_BACKUP_DIR",
                 "TMS_DISK_BACKUP_CHUNK_MB", "TMS_INIT_ENABLE", "TMS_INIT_ENABLE_CPU_BACKUP",
                 "TMS_INIT_ENABLE_DISK_BACKUP")


def host_pool() -> mr.ExpandableMemoryResource:
    return mr.ExpandableMemoryResource(reserve_size=64 * PAGE, page_size=PAGE, pageable_host=True)


def pattern(size: int, seed: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.uint32) * 2654435761 + seed) >> 11).astype(np.uint8)


def fill(buf: rrmm.DeviceBuffer, seed: int) -> np.ndarray:
    data = pattern(buf.size, seed)
    buf.copy_from_host(data)
    return data


def contents(buf: rrmm.DeviceBuffer) -> np.ndarray:
    return np.frombuffer(buf.tobytes(), dtype=np.uint8)


def tagged() -> mr.TaggedMemoryResource:
    t = mr.get_current_device_resource()
    assert isinstance(t, mr.TaggedMemoryResource)
    return t


def files_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


@pytest.fixture(autouse=True)
def _fresh_current_resource() -> Any:
    yield
    _clear_per_device_resources()


@pytest.fixture
def no_tms_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TMS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------------------------
# The model


class Buf:
    """A buffer of the model: its pool's (tag, kind), and its bytes (None: undefined)."""

    def __init__(self, buf: rrmm.DeviceBuffer, tag: str, kind: str, data: np.ndarray | None):
        self.buf, self.tag, self.kind, self.data = buf, tag, kind, data


class SaverMachine(RuleBasedStateMachine):
    """torch_memory_saver's calls against its documented behaviour (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        _clear_per_device_resources()
        self.saved_env = {k: os.environ.get(k) for k in TMS_VARIABLES}
        self.disk_dir = tempfile.mkdtemp(prefix="rrmm-tms-disk-")
        self.saver = TorchMemorySaver(make_pool=host_pool)
        self.buffers: list[Buf] = []
        #: (tag, kind) of every pool a region used, and those paused now.
        self.pools: set[tuple[str, str]] = set()
        self.paused: set[tuple[str, str]] = set()
        #: The bytes a CPU backup holds after a retaining resume: (tag, kind) -> ranges
        #: [(address, bytes)], merged where adjacent, as of the pause.
        self.retained: dict[tuple[str, str], list[tuple[int, np.ndarray]]] = {}
        self.at_pause: dict[tuple[str, str], list[tuple[int, np.ndarray]]] = {}
        #: Bytes each paused disk pool wrote; each pool's backing changes.
        self.on_disk: dict[tuple[str, str], int] = {}
        self.changes: dict[tuple[str, str], int] = {}
        self.seed = 0
        self.retain = False
        self.backend = "pinned"

    @initialize(retain=st.booleans(), backend=st.sampled_from([None, "pinned", "mmap"]))
    def start(self, retain: bool, backend: str | None) -> None:
        """The environment of this example, read when the saver starts."""
        for name in TMS_VARIABLES:
            os.environ.pop(name, None)
        if retain:
            os.environ["TMS_RETAIN_CPU_BACKUP"] = "1"
        if backend is not None:
            os.environ["TMS_INIT_CPU_BACKUP_BACKEND"] = backend
        os.environ["TMS_DISK_BACKUP_DIR"] = self.disk_dir
        os.environ["TMS_DISK_BACKUP_CHUNK_MB"] = "1"
        self.saver._ensure_initialized()
        self.restore_env()
        self.retain = retain
        self.backend = backend or "pinned"
        assert self.saver.retain_cpu_backup is retain

    def restore_env(self) -> None:
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def teardown(self) -> None:
        self.restore_env()
        if self.paused:
            self.saver.resume()
        self.buffers.clear()
        _clear_per_device_resources()
        shutil.rmtree(self.disk_dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    def kind(self, backup: tuple[bool, bool, str | None]) -> str:
        cpu, disk, backend = backup
        return "disk" if disk else (backend or self.backend) if cpu else "none"

    def pool(self, tag: str, kind: str) -> mr.ExpandableMemoryResource:
        names = self.saver._names
        key = {"none": "no backup"}.get(kind, kind)
        return tagged().pool(names[(tag, key)])

    def allocate_in(self, tag: str, backup: tuple[bool, bool, str | None], pages: int) -> None:
        """One buffer in a region of ``tag`` (already entered by the caller)."""
        kind = self.kind(backup)
        self.pools.add((tag, kind))
        if (tag, kind) in self.paused:
            with pytest.raises(RuntimeError, match="asleep"):
                rrmm.DeviceBuffer(size=pages * PAGE)
            return
        buf = rrmm.DeviceBuffer(size=pages * PAGE)
        self.seed += 1
        self.buffers.append(Buf(buf, tag, kind, fill(buf, self.seed)))

    def snapshot(self, key: tuple[str, str]) -> list[tuple[int, np.ndarray]]:
        """The pool's live bytes now, as ranges merged where adjacent."""
        ranges: list[tuple[int, np.ndarray]] = []
        for b in sorted((b for b in self.buffers if (b.tag, b.kind) == key),
                        key=lambda b: b.buf.ptr):
            data = b.data
            assert data is not None, "only pools with a backup are snapshot"
            if ranges and ranges[-1][0] + len(ranges[-1][1]) == b.buf.ptr:
                ranges[-1] = (ranges[-1][0], np.concatenate([ranges[-1][1], data]))
            else:
                ranges.append((b.buf.ptr, data))
        return ranges

    def tags_pools(self, tag: str | None) -> list[tuple[str, str]]:
        return sorted(k for k in self.pools if tag is None or k[0] == tag)

    # ------------------------------------------------------------------ rules

    def region(self, tag: str, backup: tuple[bool, bool, str | None]) -> Any:
        cpu, disk, backend = backup
        return self.saver.region(tag=tag, enable_cpu_backup=cpu, enable_disk_backup=disk,
                                 cpu_backup_backend=backend)  # type: ignore[arg-type]

    def allocate_in_region(self, tag: str, backup: tuple[bool, bool, str | None], pages: int,
                           meet: threading.Barrier | None = None) -> None:
        """One buffer in a region of ``tag``; with ``meet``, met by another thread once inside
        and again once allocated."""
        with self.region(tag, backup):
            if meet is not None:
                meet.wait()
            self.allocate_in(tag, backup, pages)
            if meet is not None:
                meet.wait()

    @rule(tag=st.sampled_from(TAGS), backup=st.sampled_from(BACKUPS), pages=st.integers(1, 2))
    def allocate(self, tag: str, backup: tuple[bool, bool, str | None], pages: int) -> None:
        self.allocate_in_region(tag, backup, pages)

    @rule(outer=st.sampled_from(TAGS), inner=st.sampled_from(TAGS),
          backups=st.tuples(st.sampled_from(BACKUPS), st.sampled_from(BACKUPS)))
    def nested(self, outer: str, inner: str,
               backups: tuple[tuple[bool, bool, str | None], ...]) -> None:
        """A region inside a region of the same thread: the inner one's tag and backup until it
        ends, the outer one's again after."""
        with self.region(outer, backups[0]):
            self.allocate_in_region(inner, backups[1], 1)
            self.allocate_in(outer, backups[0], 1)

    @rule(tags=st.tuples(st.sampled_from(TAGS), st.sampled_from(TAGS)),
          backups=st.tuples(st.sampled_from(BACKUPS), st.sampled_from(BACKUPS)))
    def regions_on_two_threads(self, tags: tuple[str, str],
                               backups: tuple[tuple[bool, bool, str | None], ...]) -> None:
        """A region on another thread while this one is in its own: both allocate at once."""
        meet = threading.Barrier(2, timeout=30)
        errors: list[BaseException] = []

        def other() -> None:
            try:
                self.allocate_in_region(tags[1], backups[1], 1, meet)
            except BaseException as e:  # noqa: BLE001 (reported by the main thread)
                errors.append(e)
                meet.abort()

        thread = threading.Thread(target=other)
        thread.start()
        self.allocate_in_region(tags[0], backups[0], 1, meet)
        thread.join()
        assert not errors, errors

    @rule(tag=st.sampled_from(TAGS), backup=st.sampled_from(BACKUPS))
    def disabled_inside_a_region(self, tag: str, backup: tuple[bool, bool, str | None]) -> None:
        self.pools.add((tag, self.kind(backup)))
        with self.region(tag, backup), self.saver.disable():
            buf = rrmm.DeviceBuffer(size=PAGE)
        self.seed += 1
        self.buffers.append(Buf(buf, OUTSIDE, "outside", fill(buf, self.seed)))

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 1 << 10))
    def free(self, i: int) -> None:
        self.buffers.pop(i % len(self.buffers))

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 1 << 10), seed=st.integers(0, 255))
    def rewrite(self, i: int, seed: int) -> None:
        b = self.buffers[i % len(self.buffers)]
        if (b.tag, b.kind) in self.paused:
            with pytest.raises(RuntimeError, match="asleep"):
                b.buf.copy_from_host(pattern(b.buf.size, seed))
            return
        b.data = fill(b.buf, seed)

    def move(self, tag: str | None, pause: bool) -> list[tuple[str, str]]:
        """Pauses or resumes ``tag`` (every tag: None); the pools it moved. A tag with pools
        none of which can move is refused; a tag no region used is nothing to move."""
        mine = self.tags_pools(tag)
        movable = [k for k in mine if (k in self.paused) != pause]
        call = self.saver.pause if pause else self.saver.resume
        if tag is not None and mine and not movable:
            with pytest.raises(RuntimeError, match="paused already" if pause else "not paused"):
                call(tag)
            return []
        call(tag)
        return movable

    @rule(tag=st.sampled_from([*TAGS, "never-used", None]))
    def pause(self, tag: str | None) -> None:
        for key in self.move(tag, pause=True):
            self.paused.add(key)
            self.changes[key] = self.changes.get(key, 0) + 1
            self.retained.pop(key, None)
            mine = [b for b in self.buffers if (b.tag, b.kind) == key]
            self.at_pause[key] = self.snapshot(key) if key[1] in ("pinned", "mmap") else []
            if key[1] == "none":
                for b in mine:
                    b.data = None
            if key[1] == "disk":
                self.on_disk[key] = sum(b.buf.size for b in mine)
            pool = self.pool(*key)
            report = pool.last_sleep()
            assert report is not None
            if key[1] in ("pinned", "mmap"):
                assert not report["host_pinned"], "plain pages on host memory"
            assert report["disk_bytes"] == self.on_disk.get(key, 0)

    @rule(tag=st.sampled_from([*TAGS, "never-used", None]))
    def resume(self, tag: str | None) -> None:
        for key in self.move(tag, pause=False):
            self.paused.discard(key)
            self.changes[key] = self.changes.get(key, 0) + 1
            self.on_disk.pop(key, None)
            snapshot = self.at_pause.pop(key)
            if key[1] in ("pinned", "mmap") and self.retain:
                self.retained[key] = snapshot

    @rule(on=st.booleans())
    def set_retain(self, on: bool) -> None:
        self.saver.retain_cpu_backup = on
        assert self.saver.retain_cpu_backup is on
        self.retain = on

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 1 << 10), zero_copy=st.booleans())
    def get_cpu_backup(self, i: int, zero_copy: bool) -> None:
        b = self.buffers[i % len(self.buffers)]
        key = (b.tag, b.kind)
        got = self.saver.get_cpu_backup(b.buf, zero_copy=zero_copy)
        if key in self.paused and b.kind in ("pinned", "mmap"):
            ranges = self.at_pause[key]
        elif key in self.retained:
            ranges = self.retained[key]
        else:
            assert got is None, (key, "no backup")
            return
        want = None
        for at, data in ranges:
            if at <= b.buf.ptr and b.buf.ptr + b.buf.size <= at + len(data):
                want = data[b.buf.ptr - at:b.buf.ptr - at + b.buf.size]
        if want is None:
            assert got is None, (key, "not in the backup")
            return
        assert got is not None and got.dtype == np.uint8, key
        assert np.array_equal(got, want), key
        del got  # a zero-copy view must not outlive the backup

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_byte_and_every_pool_match_the_model(self) -> None:
        for b in self.buffers:
            if (b.tag, b.kind) in self.paused:
                with pytest.raises(RuntimeError, match="asleep"):
                    b.buf.tobytes()
            elif b.data is not None:
                assert np.array_equal(contents(b.buf), b.data), (b.tag, b.kind)
        if self.saver._pools is None:
            return
        for key in self.pools:
            (state,) = self.pool(*key).movement()
            assert (state["phase"] == "asleep") == (key in self.paused), key
            if key in self.paused:
                assert state["device_bytes"] == 0, key
            assert state["backing_changes"] == self.changes.get(key, 0), key
        assert files_bytes(self.disk_dir) == sum(self.on_disk.values())


TestSaverMachine = SaverMachine.TestCase
TestSaverMachine.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)


# ---------------------------------------------------------------------------------------------
# The calls one by one


def test_pause_and_resume_messages_say_what_is_wrong(no_tms_environment: None) -> None:
    """Issue 50: a tag paused already is not "no paused allocations"."""
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(tag="kv"):
        kv = rrmm.DeviceBuffer(size=PAGE)
    saver.pause("nope")  # no region used it: nothing to do, as torch_memory_saver
    saver.resume("nope")
    with pytest.raises(RuntimeError, match=r"resume\('kv'\): the tag is not paused"):
        saver.resume("kv")
    saver.pause("kv")
    with pytest.raises(RuntimeError, match=r"pause\('kv'\): the tag is paused already"):
        saver.pause("kv")
    saver.pause()  # every awake tag: none left, no error
    saver.resume()
    saver.resume()  # every paused tag: none left
    assert kv.size == PAGE


def test_regions_are_per_thread_and_nest(no_tms_environment: None) -> None:
    saver = TorchMemorySaver(make_pool=host_pool)
    inside = threading.Barrier(2, timeout=30)
    bufs: dict[str, rrmm.DeviceBuffer] = {}

    def other() -> None:
        with saver.region(tag="b"):
            inside.wait()
            bufs["b"] = rrmm.DeviceBuffer(size=PAGE)
            inside.wait()

    thread = threading.Thread(target=other)
    thread.start()
    with saver.region(tag="a"):
        inside.wait()
        bufs["a"] = rrmm.DeviceBuffer(size=PAGE)
        with saver.region(tag="c", enable_cpu_backup=True):
            bufs["c"] = rrmm.DeviceBuffer(size=PAGE)
        bufs["a2"] = rrmm.DeviceBuffer(size=PAGE)
        inside.wait()
    thread.join()
    t = tagged()
    for tag, names in {"a": ["a", "a2"], "b": ["b"], "c": ["c"]}.items():
        saver.pause(tag)
        assert t.pool(tag).asleep
        for name, buf in bufs.items():
            if name in names:
                with pytest.raises(RuntimeError, match="asleep"):
                    buf.tobytes()
            elif not t.pool(name[0]).asleep:
                assert len(buf.tobytes()) == PAGE
    saver.resume()


def test_a_tag_with_and_without_a_backup_keeps_exactly_the_backed_up_bytes(
        no_tms_environment: None) -> None:
    """As torch_memory_saver's cpu_backup example: one tag, one region with a backup and one
    without; the pause keeps the first's bytes only."""
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(enable_cpu_backup=True):
        kept = rrmm.DeviceBuffer(size=PAGE)
    with saver.region(enable_cpu_backup=False):
        dropped = rrmm.DeviceBuffer(size=PAGE)
    kept_data, _ = fill(kept, 1), fill(dropped, 2)
    assert not saver.retain_cpu_backup
    saver.pause()
    backup = saver.get_cpu_backup(kept)
    assert np.array_equal(backup, kept_data)
    assert saver.get_cpu_backup(dropped) is None
    saver.resume()
    assert np.array_equal(contents(kept), kept_data)
    assert saver.get_cpu_backup(kept) is None, "given back at the resume"
    assert tagged().pool("default").last_sleep()["copied_bytes"] == PAGE


def test_retained_backups_stay_readable_and_the_next_pause_reuses_their_pages(
        no_tms_environment: None) -> None:
    """As torch_memory_saver's retain example: same host address across resumes while
    retained, released by a later non-retaining resume. (The supply starts empty, so the
    backup is one host range: a view. One that spans two ranges is given as a copy.)"""
    rrmm.host_pages.wait()
    rrmm.host_pages.give_back()
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(tag="w", enable_cpu_backup=True, cpu_backup_backend="mmap"):
        w = rrmm.DeviceBuffer(size=2 * PAGE)
    first_data = fill(w, 3)
    saver.pause("w")
    first = saver.get_cpu_backup(w, zero_copy=True)
    address = first.__array_interface__["data"][0]
    assert np.array_equal(first, first_data)
    del first
    saver.retain_cpu_backup = True
    saver.resume("w")
    after = saver.get_cpu_backup(w, zero_copy=True)
    assert after.__array_interface__["data"][0] == address and np.array_equal(after, first_data)
    del after
    saver.retain_cpu_backup = False  # consulted at the resume: frees nothing now
    assert np.array_equal(saver.get_cpu_backup(w), first_data)
    second_data = fill(w, 4)
    saver.pause("w")
    second = saver.get_cpu_backup(w, zero_copy=True)
    assert second.__array_interface__["data"][0] == address, "the retained pages again"
    assert np.array_equal(second, second_data)
    del second
    saver.resume("w")
    assert saver.get_cpu_backup(w) is None
    assert np.array_equal(contents(w), second_data)


def test_the_first_pause_of_a_region_finds_its_host_pages_made_while_it_grew(
        no_tms_environment: None) -> None:
    rrmm.host_pages.give_back()
    saver = TorchMemorySaver(make_pool=host_pool)
    made = rrmm.host_pages.figures()["made_on_take"]
    bufs = []
    for i in range(4):
        with saver.region(tag="w", enable_cpu_backup=True):
            bufs.append(rrmm.DeviceBuffer(size=2 * PAGE))
        fill(bufs[-1], i)
    rrmm.host_pages.wait()  # made in the background as the region grew (no call asked)
    saver.pause("w")
    report = tagged().pool("w").last_sleep()
    assert report is not None and report["host_reused"], report
    assert rrmm.host_pages.figures()["made_on_take"] == made, "the pause made no pages"
    saver.resume("w")


def test_an_mmap_backup_holds_no_host_memory_while_awake(no_tms_environment: None) -> None:
    """The reclaimable backend: pages made at the pause, given back at the resume, none made
    ahead while the region grows."""
    import gc

    gc.collect()  # earlier tests' savers: their pools keep pages ready until collected
    rrmm.host_pages.wait()
    rrmm.host_pages.give_back()
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(tag="m", enable_cpu_backup=True, cpu_backup_backend="mmap"):
        bufs = [rrmm.DeviceBuffer(size=2 * PAGE) for _ in range(3)]
    data = [fill(b, i) for i, b in enumerate(bufs)]
    rrmm.host_pages.wait()
    held = rrmm.host_pages.figures()
    assert held["free_bytes"] == 0 and held["leased_bytes"] == 0, held
    saver.pause("m")
    assert rrmm.host_pages.figures()["leased_bytes"] >= 6 * PAGE, "made at the pause"
    saver.resume("m")
    after = rrmm.host_pages.figures()
    assert after["free_bytes"] == 0 and after["leased_bytes"] == 0, after
    assert all(np.array_equal(contents(b), d) for b, d in zip(bufs, data, strict=True))


def test_a_disk_backup_holds_no_host_pages_ahead(no_tms_environment: None,
                                                 tmp_path: Any) -> None:
    """A disk-backed region writes through small staging ranges: no pinned pages are made
    ahead for it while it grows (they would only be held), and its bytes come back."""
    import gc

    gc.collect()
    rrmm.host_pages.wait()
    rrmm.host_pages.give_back()
    saver = TorchMemorySaver(make_pool=host_pool)
    saver.set_disk_backup_dir(str(tmp_path))
    with saver.region(tag="d", enable_disk_backup=True):
        bufs = [rrmm.DeviceBuffer(size=2 * PAGE) for _ in range(3)]
    data = [fill(b, i) for i, b in enumerate(bufs)]
    rrmm.host_pages.wait()
    held = rrmm.host_pages.figures()
    assert held["free_bytes"] == 0 and held["leased_bytes"] == 0, held
    saver.pause("d")
    assert files_bytes(str(tmp_path)) >= 6 * PAGE
    saver.resume("d")
    assert all(np.array_equal(contents(b), d) for b, d in zip(bufs, data, strict=True))


def test_a_resume_maps_what_the_pause_took(no_tms_environment: None) -> None:
    """A pause gives back a region's free pages too; its resume maps as much as the region's
    pool held at the pause (as torch_memory_saver's resume maps back PyTorch's cached
    segments), so the next step's allocations map nothing more."""
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(tag="w", enable_cpu_backup=True):
        keep = rrmm.DeviceBuffer(size=2 * PAGE)
        gone = [rrmm.DeviceBuffer(size=3 * PAGE) for _ in range(2)]
    data = fill(keep, 5)
    del gone
    pool = tagged().pool(saver._names[("w", "pinned")])
    before = pool.mapped_bytes()
    assert before >= 8 * PAGE
    allocations = _rrmm._memory_stats(pool)["allocation.all.allocated"]
    saver.pause("w")
    assert pool.mapped_bytes() == 0
    saver.resume("w")
    assert pool.mapped_bytes() == before
    assert _rrmm._memory_stats(pool)["allocation.all.allocated"] == allocations, "nothing allocated"
    assert np.array_equal(contents(keep), data)
    with saver.region(tag="w", enable_cpu_backup=True):
        again = [rrmm.DeviceBuffer(size=3 * PAGE) for _ in range(2)]
    assert pool.mapped_bytes() == before, "the step after the resume fits what is mapped"
    del again


def test_disk_chunks_are_torch_memory_savers_256_mib_unless_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``TMS_DISK_BACKUP_CHUNK_MB``: 256 MiB when unset or 0, as torch_memory_saver reads it."""
    from rrmm.compat.torch_memory_saver import _Config

    for value, mib in ((None, 256), ("0", 256), ("8", 8)):
        if value is None:
            monkeypatch.delenv("TMS_DISK_BACKUP_CHUNK_MB", raising=False)
        else:
            monkeypatch.setenv("TMS_DISK_BACKUP_CHUNK_MB", value)
        assert _Config().disk_chunk_bytes == mib << 20, value


def test_the_saver_is_torch_memory_savers_to_the_letter() -> None:
    """Every public name, call and keyword of torch_memory_saver 0.0.10."""
    import inspect

    import rrmm.compat.torch_memory_saver as tms

    for name in ("TorchMemorySaver", "configure_subprocess", "torch_memory_saver"):
        assert hasattr(tms, name), name
    calls = {
        "region": ["tag", "enable_cpu_backup", "enable_disk_backup", "cpu_backup_backend"],
        "cuda_graph": ["cuda_graph", "pool", "stream", "capture_error_mode", "tag",
                       "enable_cpu_backup", "cpu_backup_backend"],
        "disable": [], "pause": ["tag"], "resume": ["tag"], "get_cpu_backup": ["x", "zero_copy"],
        "set_disk_backup_dir": ["path"],
    }
    for call, params in calls.items():
        got = list(inspect.signature(getattr(TorchMemorySaver, call)).parameters)[1:]
        assert got == params, (call, got)
    for prop in ("enabled", "hook_mode", "memory_margin_bytes", "retain_cpu_backup"):
        assert isinstance(getattr(TorchMemorySaver, prop), property), prop
    with tms.configure_subprocess():
        assert os.environ["RRMM_AS_TORCH_MEMORY_SAVER"] == "1"


def test_the_watcher_hears_a_pause_and_a_resume_and_may_call_rrmm(
        no_tms_environment: None) -> None:
    pool = host_pool()
    heard: list[tuple[str, bool, int]] = []

    def watcher(event: str, base: int, size: int) -> None:
        (state,) = pool.movement()  # calls into rrmm with the GIL taken: no deadlock
        heard.append((event, pool.asleep, state["backing_changes"]))
        assert size == pool.reserved_bytes()

    pool.set_backing_watcher(watcher)
    buf = rrmm.DeviceBuffer(size=PAGE, mr=pool)
    done: list[BaseException] = []

    def sleep_and_wake() -> None:
        try:
            pool.offload()
            pool.restore()
        except BaseException as e:  # noqa: BLE001 (reported below)
            done.append(e)

    thread = threading.Thread(target=sleep_and_wake)  # another thread: the GIL is taken back
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not done, done
    with pytest.raises(ValueError, match="disk_dir"):
        pool.offload(to_disk=os.path.join(tempfile.gettempdir(), "rrmm-no-such-dir-xyz"))
    assert heard == [("sleep", False, 0), ("wake", False, 2), ("sleep", False, 2),
                     ("wake", False, 2)]
    pool.set_backing_watcher(None)
    del buf


# ---------------------------------------------------------------------------------------------
# Disk backups


@pytest.fixture
def disk_dir() -> Any:
    d = tempfile.mkdtemp(prefix="rrmm-tms-disk-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_disk_backup_round_trips_in_chunks_three_times(
        disk_dir: str, no_tms_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """As torch_memory_saver's disk_backup example: many chunks, an uneven tail, the disk's use
    the same every cycle, no host memory held while paused."""
    monkeypatch.setenv("TMS_DISK_BACKUP_CHUNK_MB", "1")
    saver = TorchMemorySaver(make_pool=host_pool)
    saver.set_disk_backup_dir(disk_dir)
    with saver.region(enable_disk_backup=True):
        big = rrmm.DeviceBuffer(size=3 * PAGE + 12345)
        small = rrmm.DeviceBuffer(size=7)
    with saver.region(enable_disk_backup=False):
        dropped = rrmm.DeviceBuffer(size=PAGE)
    big_data, small_data = fill(big, 1), fill(small, 2)
    sizes = set()
    for _ in range(3):
        saver.pause()
        files = os.listdir(disk_dir)
        assert len(files) >= 1 and files_bytes(disk_dir) >= big.size + small.size, files
        sizes.add(files_bytes(disk_dir))
        report = tagged().pool("default").last_sleep()
        assert report is not None and report["host_bytes"] == 0 and report["disk_bytes"] > 0
        assert saver.get_cpu_backup(big) is None, "a disk backup is no CPU backup"
        saver.resume()
        assert np.array_equal(contents(big), big_data)
        assert np.array_equal(contents(small), small_data)
        assert os.listdir(disk_dir) == [], "removed at the resume"
    assert len(sizes) == 1
    del dropped


def test_a_missing_or_unmakeable_disk_directory_is_a_value_error(
        disk_dir: str, no_tms_environment: None) -> None:
    saver = TorchMemorySaver(make_pool=host_pool)
    blocker = os.path.join(disk_dir, "a-file")
    with open(blocker, "w") as f:
        f.write("x")
    with pytest.raises(ValueError, match="cannot be made"):
        saver.set_disk_backup_dir(os.path.join(blocker, "backups"))
    missing = os.path.join(disk_dir, "made", "later")
    saver.set_disk_backup_dir(missing)  # made, as torch_memory_saver makes it
    with saver.region(tag="d", enable_disk_backup=True):
        buf = rrmm.DeviceBuffer(size=PAGE)
    data = fill(buf, 5)
    shutil.rmtree(os.path.join(disk_dir, "made"))
    saver.pause("d")  # made again at the pause
    saver.resume("d")
    assert np.array_equal(contents(buf), data)
    # The pool itself makes nothing: a missing directory refuses its sleep.
    pool = tagged().pool("d")
    with pytest.raises(ValueError, match="disk_dir"):
        pool.offload(to_disk=os.path.join(disk_dir, "gone"))
    assert not pool.asleep and np.array_equal(contents(buf), data)


def test_a_backup_file_that_vanished_or_shrank_keeps_the_tag_paused(
        disk_dir: str, no_tms_environment: None) -> None:
    saver = TorchMemorySaver(make_pool=host_pool)
    saver.set_disk_backup_dir(disk_dir)
    with saver.region(tag="d", enable_disk_backup=True):
        a = rrmm.DeviceBuffer(size=2 * PAGE)
        b = rrmm.DeviceBuffer(size=2 * PAGE)
    data = [fill(a, 6), fill(b, 7)]
    saver.pause("d")
    files = sorted(os.listdir(disk_dir))
    assert len(files) == 2, files
    path = os.path.join(disk_dir, files[1])
    with open(path, "rb") as f:
        saved = f.read()
    os.remove(path)
    with pytest.raises(RuntimeError, match="is gone.*still asleep"):
        saver.resume("d")
    assert tagged().pool("d").asleep and sorted(os.listdir(disk_dir)) == files[:1]
    with open(path, "wb") as f:
        f.write(saved[:-10])
    with pytest.raises(RuntimeError, match="were written"):
        saver.resume("d")
    with open(path, "wb") as f:
        f.write(saved)
    saver.resume("d")
    assert np.array_equal(contents(a), data[0]) and np.array_equal(contents(b), data[1])


FULL_DISK_CHILD = """
import os, resource, signal
import numpy as np, rrmm
from rrmm import mr
from rrmm.compat.torch_memory_saver import TorchMemorySaver
PAGE = 2 << 20
def host_pool():
    return mr.ExpandableMemoryResource(reserve_size=64 * PAGE, page_size=PAGE, pageable_host=True)
saver = TorchMemorySaver(make_pool=host_pool)
saver.set_disk_backup_dir(os.environ["DISK_DIR"])
with saver.region(tag="d", enable_disk_backup=True):
    buf = rrmm.DeviceBuffer(size=4 * PAGE)
with saver.region(tag="c", enable_cpu_backup=True):
    other = rrmm.DeviceBuffer(size=PAGE)
data = ((np.arange(buf.size, dtype=np.uint32) * 7) >> 3).astype(np.uint8)
buf.copy_from_host(data)
LIMIT
try:
    saver.pause()
except MemoryError as e:
    assert "no room" in str(e), e
else:
    raise AssertionError("the pause went through a full disk")
t = mr.get_current_device_resource()
assert not t.pool("d").asleep and not t.pool("c").asleep, "a refused pause changed nothing"
assert np.array_equal(np.frombuffer(buf.tobytes(), dtype=np.uint8), data)
assert os.listdir(os.environ["DISK_DIR"]) == [], os.listdir(os.environ["DISK_DIR"])
print("CHILD OK")
"""


def test_a_full_disk_refuses_the_pause_and_changes_nothing(disk_dir: str) -> None:
    """A file size limit (``RLIMIT_FSIZE``, no privileges needed): the disk is full for this
    process past 1 MiB."""
    code = FULL_DISK_CHILD.replace("LIMIT", textwrap.dedent("""
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
    """))
    out = run_fresh(code, timeout=60, env={"DISK_DIR": disk_dir})
    assert "CHILD OK" in out


def test_a_full_tmpfs_refuses_the_pause_and_changes_nothing(disk_dir: str) -> None:
    """A real full disk (``ENOSPC``): a 1 MiB tmpfs, mounted in a mount namespace of the test's
    own where the machine allows one."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a tmpfs of the test's own")
    mount = f"mount -t tmpfs -o size=1m tmpfs {disk_dir}"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", mount], capture_output=True,
                           text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"this machine lets no test mount a tmpfs: {probe.stderr.strip()}")
    script = os.path.join(disk_dir, "..", os.path.basename(disk_dir) + "-child.py")
    with open(script, "w") as f:
        f.write(FULL_DISK_CHILD.replace("LIMIT", ""))
    try:
        run = subprocess.run(
            ["unshare", "-rm", "sh", "-c",
             f"{mount} && exec {sys.executable} {script}"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "DISK_DIR": disk_dir})
    finally:
        os.remove(script)
    assert run.returncode == 0 and "CHILD OK" in run.stdout, run.stdout + run.stderr


# ---------------------------------------------------------------------------------------------
# TMS_INIT_ENABLE: the whole process in a region from the start

INIT_CHILD = """
import os, threading
import numpy as np, rrmm
from rrmm import mr
from rrmm.compat._tag_pools import OUTSIDE
from rrmm.compat.torch_memory_saver import TorchMemorySaver
PAGE = 2 << 20
def host_pool():
    return mr.ExpandableMemoryResource(reserve_size=64 * PAGE, page_size=PAGE, pageable_host=True)
def fill(buf, seed):
    data = ((np.arange(buf.size, dtype=np.uint32) * 2654435761 + seed) >> 11).astype(np.uint8)
    buf.copy_from_host(data)
    return data
def same(buf, data):
    return np.array_equal(np.frombuffer(buf.tobytes(), dtype=np.uint8), data)
saver = TorchMemorySaver(make_pool=host_pool)
saver._ensure_initialized()
weights = rrmm.DeviceBuffer(size=2 * PAGE)          # in no explicit region
got = {}
t = threading.Thread(target=lambda: got.setdefault("b", rrmm.DeviceBuffer(size=PAGE)))
t.start(); t.join()                                  # another thread: the same region
with saver.region(tag="grad_buffer", enable_cpu_backup=False):
    grad = rrmm.DeviceBuffer(size=PAGE)
with saver.disable():
    free_standing = rrmm.DeviceBuffer(size=PAGE)
after = rrmm.DeviceBuffer(size=PAGE)                 # the process's region again
data = {id(b): fill(b, i) for i, b in enumerate([weights, got["b"], grad, free_standing, after])}
saver.pause()
tagged = mr.get_current_device_resource()
ENABLED = os.environ.get("TMS_INIT_ENABLE") == "1"
KEEPS = ENABLED and "1" in (os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP"),
                            os.environ.get("TMS_INIT_ENABLE_DISK_BACKUP"))
assert tagged.pool("grad_buffer").asleep and not tagged.pool(OUTSIDE).asleep
assert same(free_standing, data[id(free_standing)]), "disable(): never paused"
for b in (weights, got["b"], after):
    try:
        b.tobytes()
        paused = False
    except RuntimeError as e:
        assert "asleep" in str(e), e
        paused = True
    assert paused == ENABLED, (paused, ENABLED)
if os.environ.get("TMS_INIT_ENABLE_DISK_BACKUP") == "1":
    assert os.listdir(os.environ["TMS_DISK_BACKUP_DIR"]), "written to files"
saver.resume()
for b in (weights, got["b"], after, free_standing):
    assert same(b, data[id(b)]) or (ENABLED and not KEEPS and b is not free_standing)
if ENABLED:
    assert tagged.tags[0] == "default", tagged.tags
print("CHILD OK")
"""


@pytest.mark.parametrize("env", [
    {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
    {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1",
     "TMS_INIT_CPU_BACKUP_BACKEND": "mmap"},
    {"TMS_INIT_ENABLE": "1"},
    {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_DISK_BACKUP": "1"},
    {"TMS_INIT_ENABLE_CPU_BACKUP": "1"},
], ids=["cpu-backup", "mmap-backup", "no-backup", "disk-backup", "not-enabled"])
def test_tms_init_enable_puts_the_whole_process_in_a_region(env: dict[str, str],
                                                           disk_dir: str) -> None:
    clean = {k: "" for k in TMS_VARIABLES}
    clean.update(env, TMS_DISK_BACKUP_DIR=disk_dir)
    assert "CHILD OK" in run_fresh(INIT_CHILD, timeout=60, env=clean)


def test_tms_init_backups_are_mutually_exclusive() -> None:
    code = """
        from rrmm.compat.torch_memory_saver import TorchMemorySaver
        try:
            TorchMemorySaver()._ensure_initialized()
        except ValueError as e:
            assert "mutually exclusive" in str(e), e
            print("CHILD OK")
    """
    env = {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1",
           "TMS_INIT_ENABLE_DISK_BACKUP": "1"}
    assert "CHILD OK" in run_fresh(code, timeout=60, env=env)
