"""A memory snapshot as one self-contained HTML page: the active-memory timeline of its
allocation history and its segments with their blocks and holes (``rrmm snapshot view``).

Reads what PyTorch's memory tools read: ``rrmm.memory_snapshot()`` and
``torch.cuda.memory._snapshot()`` dicts (``{"segments": [...], "device_traces": [[...]]}``),
saved with ``pickle`` or as JSON. A log of RMM's or rrmm's logging adaptor is replayed through
a pool on simulated memory first, so it becomes a snapshot with a history too. The page needs
no network and no PyTorch: SVG with tooltips, no script.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import html
import io
import json
import math
import os
import pickle
import stat
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["load_snapshot", "normalize", "render_html", "snapshot_from_log", "write_html"]

#: Allocations drawn as their own band in the timeline (the largest); the rest form one band.
MAX_BANDS = 1200
#: Columns of the timeline (events are bucketed into this many).
TIMELINE_COLUMNS = 1400
#: Points of band outlines in the timeline at most (about 40 bytes each in the page).
MAX_POINTS = 60_000
#: Segments drawn (the largest); the rest are counted.
MAX_SEGMENTS = 120
_ALLOC_ACTIONS = ("alloc",)
_FREE_ACTIONS = ("free_completed", "free")


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers): a snapshot file cannot make
    this process run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"a snapshot holds plain data only; {module}.{name} is not allowed"
        )


#: Bytes and addresses a snapshot may state (64-bit).
_LIMIT = 1 << 64
#: Frames kept per allocation or block (the tooltip shows 12).
_MAX_FRAMES = 64
#: Nesting of a JSON snapshot at most (a snapshot nests 5 deep; deeper is not one).
_MAX_DEPTH = 64


def load_snapshot(path: str, quiet: bool = True) -> dict[str, Any]:
    """Reads a snapshot (pickle or JSON) or a logging adaptor's CSV log (``.csv``, ``.csv.gz``:
    replayed with :func:`snapshot_from_log`), checked and normalised (:func:`normalize`).

    Raises ValueError naming the file for one that is none of these, or whose fields have the
    wrong shape (a size that is NaN, negative or past 64 bits, a list where a dict belongs,
    nesting deeper than any snapshot, the ``rrmm.sleep`` figures, the ``rrmm.shared_gpu``
    section), or for a path that is not a
    regular file (a directory, /dev/zero, a pipe), and OSError for one that cannot be read (a
    corrupt gzip stream included). ``quiet=False`` draws a progress bar while a log replays (on
    a terminal).
    """
    kind = _not_a_file(path)
    if kind is not None:
        raise ValueError(f"{path}: {kind}, not a snapshot or log file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"\x1f\x8b" or path.endswith((".csv", ".csv.gz")):
        opener: Any = gzip.open if head[:2] == b"\x1f\x8b" else open
        try:
            with opener(path, "rt", newline="") as text:
                return normalize(snapshot_from_log(text, quiet=quiet))
        except (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError, csv.Error) as error:
            raise ValueError(f"{path}: not a readable log ({type(error).__name__}: "
                             f"{_first_line(error)})") from None
        except ValueError as error:
            raise ValueError(f"{path}: {_first_line(error)}") from None
    with open(path, "rb") as f:
        data = f.read()
    snapshot: Any
    if data[:1] == b"\x80":
        try:
            snapshot = _PlainUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
                AttributeError, RecursionError, MemoryError, OverflowError,
                UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not a memory snapshot ({_first_line(error)})") from None
    else:
        if _json_depth(data) > _MAX_DEPTH:
            raise ValueError(f"{path}: not a memory snapshot (JSON nested deeper than "
                             f"{_MAX_DEPTH} levels)")
        try:
            snapshot = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise ValueError(
                f"{path}: not a memory snapshot (pickle or JSON) or a CSV log "
                f"({_first_line(error)})"
            ) from None
    if not isinstance(snapshot, dict) or not (
        "segments" in snapshot or "device_traces" in snapshot
    ):
        raise ValueError(f"{path}: not a memory snapshot (no 'segments' or 'device_traces')")
    try:
        return normalize(snapshot)
    except ValueError as error:
        raise ValueError(f"{path}: not a memory snapshot: {error}") from None


#: What each kind of path that is not a regular file is, in words: a snapshot is read whole
#: (a device such as /dev/zero never ends) and twice (its head, then all: a pipe cannot be).
_NOT_FILES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe (save what it carries to a file first)"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(path: str) -> str | None:
    """What ``path`` is when it is not a regular file, in words; None for a regular file (and
    for a missing one: opening it raises FileNotFoundError)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    return next((words for test, words in _NOT_FILES if test(mode)), None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def _json_depth(data: bytes) -> int:
    """The deepest nesting of brackets in ``data`` (strings skipped), without parsing it: a
    deeply nested file is refused before the parser recurses."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > _MAX_DEPTH:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _size(value: Any, where: str) -> int:
    """A size or address of a snapshot: a whole number in [0, 2**64) (a float only when it is a
    whole number, as JSON writers give large ints)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # A field of the file, not an argument: ValueError, as for every bad snapshot.
        raise ValueError(f"{where} is {type(value).__name__} {_short(value)}, not a number")  # noqa: TRY004
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{where} is {value!r}, not a whole number")
        value = int(value)
    if not 0 <= value < _LIMIT:
        raise ValueError(f"{where} is {_short(value)}, outside 0..2**64")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} is {type(value).__name__}, not a list")  # noqa: TRY004
    return list(value)


def _dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} is {type(value).__name__} {_short(value)}, not a dict")  # noqa: TRY004
    return value


def _frames(value: Any, where: str) -> list[dict[str, str]]:
    out = []
    for i, frame in enumerate(_list(value, where)[:_MAX_FRAMES]):
        frame = _dict(frame, f"{where}[{i}]")
        out.append({k: str(frame.get(k, "?"))[:300] for k in ("filename", "line", "name")})
    return out


def normalize(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with only the fields the page reads, each checked: segments (``address``,
    ``total_size``, ``allocated_size``, ``device``, ``is_expandable``, ``blocks`` with
    ``address``, ``size``, ``requested_size``, ``state``, ``frames``) and device traces
    (``action``, ``addr``, ``size``, ``frames``). Raises ValueError naming the first field of
    the wrong shape."""
    segments = []
    for i, raw in enumerate(_list(snapshot.get("segments"), "segments")):
        where = f"segments[{i}]"
        seg = _dict(raw, where)
        total = _size(seg.get("total_size", 0), f"{where}.total_size")
        base = _size(seg.get("address", 0), f"{where}.address")
        blocks = []
        for j, raw_block in enumerate(_list(seg.get("blocks"), f"{where}.blocks")):
            bw = f"{where}.blocks[{j}]"
            block = _dict(raw_block, bw)
            blocks.append({
                "address": _size(block.get("address", base), f"{bw}.address"),
                "size": _size(block.get("size", 0), f"{bw}.size"),
                "requested_size": _size(block.get("requested_size", 0),
                                        f"{bw}.requested_size"),
                "state": str(block.get("state", ""))[:40],
                "frames": _frames(block.get("frames"), f"{bw}.frames"),
            })
        out = {"address": base, "total_size": total, "blocks": blocks,
               "allocated_size": _size(seg.get("allocated_size", 0), f"{where}.allocated_size"),
               "is_expandable": bool(seg.get("is_expandable", False))}
        if "device" in seg:
            out["device"] = _size(seg["device"], f"{where}.device")
        if seg.get("tier") is not None:
            out["tier"] = str(seg["tier"])[:40]
        if seg.get("offloaded"):
            out["offloaded"] = True
        segments.append(out)
    traces = []
    for d, raw_trace in enumerate(_list(snapshot.get("device_traces"), "device_traces")):
        trace = []
        for i, raw in enumerate(_list(raw_trace, f"device_traces[{d}]")):
            where = f"device_traces[{d}][{i}]"
            entry = _dict(raw, where)
            trace.append({
                "action": str(entry.get("action", ""))[:40],
                "addr": _size(entry.get("addr", 0), f"{where}.addr"),
                "size": _size(entry.get("size", 0), f"{where}.size"),
                "frames": _frames(entry.get("frames"), f"{where}.frames"),
            })
        traces.append(trace)
    return {"segments": segments, "device_traces": traces,
            "rrmm": _rrmm_fields(snapshot.get("rrmm"))}


#: The figures of ``rrmm.sleep`` (``sleep_estimate()``): each a count of bytes (or of blocks).
SLEEP_FIGURES = ("released_bytes", "copied_bytes", "discarded_bytes", "free_page_bytes",
                 "cached_free_bytes", "live_blocks")
#: The byte counts of ``rrmm.spill`` (``spill_figures()``) the view reads.
SPILL_FIGURES = ("limit", "spilled", "kept", "made", "reused", "promoted")


def _rrmm_fields(value: Any) -> dict[str, Any]:
    """rrmm's own part of a snapshot (``rrmm``: a dict, or absent in PyTorch's), checked:
    ``sleep`` is None or a dict whose figures (:data:`SLEEP_FIGURES`) are each a whole number
    in [0, 2**64); a figure that is Infinity, null, a list or a string is a ValueError naming
    it, never a negative or made-up figure on the page. ``shared_gpu`` likewise
    (:func:`_shared_gpu_fields`)."""
    if value is None:
        return {}
    extra = dict(_dict(value, "rrmm"))
    sleep = extra.get("sleep")
    if sleep is not None:
        sleep = _dict(sleep, "rrmm.sleep")
        extra["sleep"] = {name: _size(sleep[name], f"rrmm.sleep.{name}")
                          for name in SLEEP_FIGURES if name in sleep}
    if extra.get("shared_gpu") is not None:
        extra["shared_gpu"] = _shared_gpu_fields(extra["shared_gpu"], "rrmm.shared_gpu")
    spill = extra.get("spill")
    if spill is not None:
        spill = _dict(spill, "rrmm.spill")
        extra["spill"] = {name: _size(spill[name], f"rrmm.spill.{name}")
                          for name in SPILL_FIGURES if name in spill}
    return extra


#: Byte counts of a process of a shared GPU's ledger (``rrmm.shared_gpu.ProcessRow``).
SHARED_GPU_FIGURES = ("live", "cached", "asleep")
#: Rows of a ledger's history shown (the newest).
MAX_HISTORY = 200
#: Processes of a ledger kept.
MAX_PROCESSES = 1024


def _shared_gpu_fields(value: Any, where: str) -> dict[str, Any]:
    """The ledger's part of a snapshot (``rrmm.shared_gpu``, from ``memory_snapshot()``),
    checked: ``pid``; ``processes``, dicts whose ``pid``, ``live``, ``cached``, ``asleep`` are
    whole numbers in [0, 2**64), ``soft_share`` and ``hard_limit`` such a number or null,
    ``idle`` true or false, ``name`` text; ``history``, dicts whose ``peer``, ``bytes`` and
    ``given`` are such numbers, ``at`` and ``seconds`` finite numbers >= 0, ``kind`` and
    ``note`` text. Raises ValueError naming the first field of the wrong shape."""
    section = _dict(value, where)
    processes: list[dict[str, Any]] = []
    for i, raw in enumerate(_list(section.get("processes"), f"{where}.processes")):
        pw = f"{where}.processes[{i}]"
        row = _dict(raw, pw)
        out: dict[str, Any] = {
            "pid": _size(row.get("pid", 0), f"{pw}.pid"),
            "name": _text(row.get("name", ""), f"{pw}.name", 80),
            "idle": _flag(row.get("idle", False), f"{pw}.idle"),
            "hard_limit_from": _text(row.get("hard_limit_from", ""), f"{pw}.hard_limit_from",
                                     40),
        }
        for name in SHARED_GPU_FIGURES:
            out[name] = _size(row.get(name, 0), f"{pw}.{name}")
        for name in ("soft_share", "hard_limit"):
            limit = row.get(name)
            out[name] = None if limit is None else _size(limit, f"{pw}.{name}")
        if len(processes) < MAX_PROCESSES:
            processes.append(out)
    history = []
    raw_history = _list(section.get("history"), f"{where}.history")
    for i, raw in enumerate(raw_history):
        hw = f"{where}.history[{i}]"
        event = _dict(raw, hw)
        checked = {
            "at": _seconds(event.get("at", 0), f"{hw}.at"),
            "kind": _text(event.get("kind", ""), f"{hw}.kind", 40),
            "peer": _size(event.get("peer", 0), f"{hw}.peer"),
            "bytes": _size(event.get("bytes", 0), f"{hw}.bytes"),
            "given": _size(event.get("given", 0), f"{hw}.given"),
            "seconds": _seconds(event.get("seconds", 0), f"{hw}.seconds"),
            "note": _text(event.get("note", ""), f"{hw}.note", 200),
        }
        if i >= len(raw_history) - MAX_HISTORY:
            history.append(checked)
    pid = section.get("pid")
    return {"pid": None if pid is None else _size(pid, f"{where}.pid"),
            "directory": _text(section.get("directory", ""), f"{where}.directory", 300),
            "processes": processes, "history": history}


def _text(value: Any, where: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where} is {type(value).__name__} {_short(value)}, not text")  # noqa: TRY004
    return value[:limit]


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where} is {type(value).__name__} {_short(value)}, "  # noqa: TRY004
                         f"not true or false")
    return value


def _seconds(value: Any, where: str) -> float:
    """A time or a duration of a snapshot: a finite number >= 0 (seconds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {type(value).__name__} {_short(value)}, not a number")  # noqa: TRY004
    if not (math.isfinite(value) and 0 <= value < _LIMIT):
        raise ValueError(f"{where} is {_short(value)}, not a number of seconds in 0..2**64")
    return float(value)


def snapshot_from_log(lines: Iterable[str], simulate: int = 1 << 50,
                      quiet: bool = True) -> dict[str, Any]:
    """Replays a logging adaptor's CSV log (``Thread,Time,Action,Pointer,Size,Stream``) through
    a pool on a simulated device of ``simulate`` bytes, recording each allocation and free, and
    returns the snapshot taken at the peak of bytes in use, with the whole history.

    Pointers in the log are keys; the addresses shown are the pool's. Failed allocations in the
    log are recorded as ``oom`` entries. Every ``allocate`` and ``free`` row is one entry, zero
    bytes included, so the page counts the events ``rrmm replay`` counts. Raises ValueError for a
    line that is not a log row. ``quiet=False``: a progress bar on a terminal while it replays.
    """
    from rrmm import _rrmm, _stack
    from rrmm._progress import Progress

    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or [h.strip() for h in header[:6]] != [
        "Thread", "Time", "Action", "Pointer", "Size", "Stream"
    ]:
        raise ValueError("not a logging adaptor's log: its header must be "
                         "Thread,Time,Action,Pointer,Size,Stream")
    rows: list[tuple[int, str, str, int, int]] = []  # (line, action, key, size, stream)
    for number, row in enumerate(reader, start=2):
        if not row:
            continue
        try:
            action, key, size = row[2].strip(), row[3].strip(), int(row[4])
            stream = row[5].strip()
            stream_id = int(stream, 16) if stream else 0
        except (IndexError, ValueError):
            raise ValueError(f"line {number}: not a log row: {','.join(row)[:80]!r}") from None
        if not 0 <= size < _LIMIT or not 0 <= stream_id < _LIMIT:
            raise ValueError(f"line {number}: size or stream out of range: "
                             f"{','.join(row)[:80]!r}")
        if action not in ("allocate", "free", "allocate failure"):
            raise ValueError(f"line {number}: unknown action {action!r}")
        rows.append((number, action, key, size, stream_id))
    # First pass: where the bytes in use peak (the segments are shown there).
    sizes: dict[str, int] = {}
    in_use = peak = 0
    peak_at = -1
    for i, (_, action, key, size, _) in enumerate(rows):
        if action == "allocate" and size > 0:
            in_use -= sizes.pop(key, 0)
            sizes[key] = size
            in_use += size
            if in_use > peak:
                peak, peak_at = in_use, i
        elif action == "free" and key in sizes:
            in_use -= sizes.pop(key)
    pool: Any = _stack.build("pool", simulate=simulate, initial_pool_size=0)
    live: dict[str, tuple[int, int]] = {}
    traces: list[dict[str, Any]] = []
    segments: Any = []
    with Progress("rrmm snapshot view: replaying the log", len(rows), quiet=quiet) as bar:
        for i, (number, action, key, size, stream_id) in enumerate(rows):
            if i % 4096 == 0:
                bar.advance(i, "rows")
            if action == "allocate":
                if key in live:  # the log reuses a live pointer: the old one ends here
                    pool.deallocate(*live.pop(key))
                try:
                    address = pool.allocate(size) if size else 0
                except MemoryError:  # more than the simulated device: a failed allocation
                    traces.append({"action": "oom", "addr": 0, "size": size,
                                   "stream": stream_id, "frames": [], "line": number})
                    continue
                live[key] = (address, size)
                traces.append({"action": "alloc", "addr": address, "size": size,
                               "stream": stream_id, "frames": [], "line": number})
            elif action == "free" and key in live:
                address, size = live.pop(key)
                if size:
                    pool.deallocate(address, size)
                traces.append({"action": "free_completed", "addr": address, "size": size,
                               "stream": stream_id, "frames": [], "line": number})
            elif action == "allocate failure":
                traces.append({"action": "oom", "addr": 0, "size": size, "stream": stream_id,
                               "frames": [], "line": number})
            if i == peak_at:
                segments = _rrmm._memory_snapshot(pool, 0) or []
    for address, size in live.values():
        if size:
            pool.deallocate(address, size)
    return {"segments": segments, "device_traces": [traces],
            "rrmm": {"source": "log", "peak_bytes": peak, "segments_at": "peak"}}


# ---------------------------------------------------------------- the timeline


@dataclass
class _Band:
    """One allocation drawn in the timeline: its columns and its offset in each."""

    address: int
    size: int
    start: int
    frames: list[dict[str, Any]]
    end: int | None = None
    points: list[tuple[int, int]] = field(default_factory=list)  # (column, offset)


@dataclass
class Timeline:
    """The active-memory timeline: allocations stacked in the order they were made; when one is
    freed, those above it move down (PyTorch's memory_viz draws the same)."""

    bands: list[_Band]
    others: list[int]  # per column, bytes of the allocations not drawn on their own
    totals: list[int]  # per column, bytes in use (the highest in the column)
    columns: int
    events: int  # allocations and frees (zero bytes included), as ``rrmm replay`` counts them
    ooms: list[int]  # the column of each failed allocation


def build_timeline(trace: Sequence[dict[str, Any]], max_bands: int = MAX_BANDS,
                   columns: int = TIMELINE_COLUMNS, max_points: int = MAX_POINTS) -> Timeline:
    """Stacks the allocations of ``trace`` into bands (:func:`stack_bands`), with fewer bands
    drawn on their own while their outlines would take more than ``max_points`` points (a page
    of a few MiB at most)."""
    while True:
        tl = stack_bands(trace, max_bands, columns)
        points = sum(len(b.points) for b in tl.bands)
        if points <= max_points or max_bands <= 16:
            return tl
        max_bands //= 2


def stack_bands(trace: Sequence[dict[str, Any]], max_bands: int = MAX_BANDS,
                columns: int = TIMELINE_COLUMNS) -> Timeline:
    """Stacks the allocations of ``trace`` (one device's trace entries) into bands.

    The ``max_bands`` largest allocations are drawn; the rest form the band on top of them.
    Events are bucketed into at most ``columns`` columns; each column shows the state after its
    last event, and a band's offset is recorded only where it changes.
    """
    events = [e for e in trace if e.get("action") in (*_ALLOC_ACTIONS, *_FREE_ACTIONS, "oom")]
    n = len(events)
    columns = max(1, min(columns, n))
    # Which allocations are drawn: the largest (by size), counted per (address, occurrence).
    occurrence: dict[int, int] = {}
    keyed: list[tuple[str, tuple[int, int], int]] = []
    for e in events:
        action, addr, size = e["action"], int(e.get("addr", 0)), int(e.get("size", 0))
        if action in _ALLOC_ACTIONS:
            k = occurrence.get(addr, 0)
            occurrence[addr] = k + 1
            keyed.append(("a", (addr, k), size))
        elif action == "oom":
            keyed.append(("o", (0, 0), size))
        else:
            k = occurrence.get(addr, 0) - 1
            keyed.append(("f", (addr, k), size))
    alloc_sizes = sorted((s for kind, _, s in keyed if kind == "a"), reverse=True)
    threshold = alloc_sizes[max_bands - 1] if len(alloc_sizes) >= max_bands else 0
    drawn_at_threshold = max_bands - sum(1 for s in alloc_sizes if s > threshold)

    stack: list[_Band] = []  # drawn, live, bottom to top
    live_drawn: dict[tuple[int, int], _Band] = {}
    live_other: dict[tuple[int, int], int] = {}
    bands: list[_Band] = []
    others = [0] * columns
    totals = [0] * columns
    ooms: list[int] = []
    other_bytes = drawn_bytes = 0
    column_of = (lambda i: i * columns // n) if n else (lambda i: 0)
    for i, (kind, key, size) in enumerate(keyed):
        col = column_of(i)
        if kind == "a":
            draw = size > 0 and (size > threshold
                                 or (size == threshold and drawn_at_threshold > 0))
            if draw and size == threshold:
                drawn_at_threshold -= 1
            if draw:
                band = _Band(key[0], size, col, events[i].get("frames") or [])
                band.points.append((col, drawn_bytes))
                stack.append(band)
                live_drawn[key] = band
                bands.append(band)
                drawn_bytes += size
            else:
                live_other[key] = size
                other_bytes += size
        elif kind == "f":
            freed = live_drawn.pop(key, None)
            if freed is not None:
                band = freed
                band.end = col
                index = stack.index(band)
                stack.pop(index)
                drawn_bytes -= band.size
                for above in stack[index:]:
                    offset = above.points[-1][1] - band.size
                    if above.points[-1][0] == col:
                        above.points[-1] = (col, offset)
                    else:
                        above.points.append((col, offset))
            elif key in live_other:
                other_bytes -= live_other.pop(key)
        else:
            ooms.append(col)
        others[col] = other_bytes
        totals[col] = max(totals[col], drawn_bytes + other_bytes)
    return Timeline(bands, others, totals, columns, n - len(ooms), ooms)


# ---------------------------------------------------------------- rendering

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#86bcb6", "#8cd17d", "#b6992d", "#499894", "#d37295",
            "#a0cbe8", "#ffbe7d"]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _frames_text(frames: Sequence[dict[str, Any]], limit: int = 12) -> str:
    lines = [f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}"
             for f in list(frames)[:limit]]
    if len(frames) > limit:
        lines.append(f"... {len(frames) - limit} more")
    return "\n".join(lines)


def _color(index: int) -> str:
    """Each allocation its own colour: the palette in the order the allocations were made, so
    two allocations made one after the other (of one source line too) never look alike."""
    return _PALETTE[index % len(_PALETTE)]


def _timeline_svg(tl: Timeline, width: int = 1200, height: int = 420) -> str:
    peak = max(tl.totals, default=0) or 1
    left, bottom, top = 70, 30, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    sx = plot_w / max(tl.columns, 1)
    sy = plot_h / peak

    def x(c: float) -> float:
        return left + c * sx

    def y(b: float) -> float:
        return top + plot_h - b * sy

    # Drawn at ``width`` and scaled down to the window (viewBox): a page that fits 1,400 px.
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" class="timeline" role="img" '
              f'aria-label="active memory timeline">')]
    for i in range(5):
        b = peak * i / 4
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(b):.1f}" y2="{y(b):.1f}" '
                     f'class="grid"/><text x="{left - 6}" y="{y(b) + 4:.1f}" '
                     f'class="axis" text-anchor="end">{_bytes(b)}</text>')
    for index, band in enumerate(tl.bands):
        if band.size == 0:
            continue
        end = band.end if band.end is not None else tl.columns
        pts = band.points
        upper: list[str] = []
        lower: list[str] = []
        for j, (c, off) in enumerate(pts):
            c_next = pts[j + 1][0] if j + 1 < len(pts) else end + 1
            if c_next <= c:
                continue
            lower += [f"{x(c):.1f},{y(off):.1f}", f"{x(c_next):.1f},{y(off):.1f}"]
            upper += [f"{x(c):.1f},{y(off + band.size):.1f}",
                      f"{x(c_next):.1f},{y(off + band.size):.1f}"]
        if not lower:
            continue
        title = html.escape(f"{_bytes(band.size)} at {band.address:#x}\n" +
                            _frames_text(band.frames))
        parts.append(f'<polygon points="{" ".join(lower + upper[::-1])}" '
                     f'fill="{_color(index)}" class="band"><title>{title}</title></polygon>')
    # The band of the allocations not drawn on their own, on top of the drawn ones.
    if any(tl.others):
        drawn = [t - o for t, o in zip(tl.totals, tl.others)]
        lower = [f"{x(c):.1f},{y(drawn[c]):.1f} {x(c + 1):.1f},{y(drawn[c]):.1f}"
                 for c in range(tl.columns)]
        upper = [f"{x(c + 1):.1f},{y(tl.totals[c]):.1f} {x(c):.1f},{y(tl.totals[c]):.1f}"
                 for c in reversed(range(tl.columns))]
        parts.append(f'<polygon points="{" ".join(lower + upper)}" class="others">'
                     f'<title>smaller allocations, together</title></polygon>')
    for c in tl.ooms:
        parts.append(f'<line x1="{x(c):.1f}" x2="{x(c):.1f}" y1="{top}" y2="{top + plot_h}" '
                     f'class="oom"><title>allocation failed</title></line>')
    parts.append(f'<text x="{left}" y="{height - 8}" class="axis">event 0</text>'
                 f'<text x="{width - 10}" y="{height - 8}" class="axis" text-anchor="end">'
                 f'event {tl.events}</text></svg>')
    return "".join(parts)


def _segments_html(segments: Sequence[dict[str, Any]], width: int = 1100) -> str:
    if not segments:
        return '<p class="muted">No segments: the resource holds no pool.</p>'
    shown = sorted(segments, key=lambda s: -int(s.get("total_size", 0)))[:MAX_SEGMENTS]
    shown.sort(key=lambda s: int(s.get("address", 0)))
    biggest = max(int(s.get("total_size", 0)) for s in shown) or 1
    smallest = min(int(s.get("total_size", 0)) for s in shown) or 1
    span = math.log2(biggest / smallest) if biggest > smallest else 1.0
    rows = []
    for seg in shown:
        total = int(seg.get("total_size", 0))
        base = int(seg.get("address", 0))
        # Widths on a log scale (from a quarter of the page up), so small segments stay visible.
        w = width * (0.25 + 0.75 * math.log2(max(total, 1) / smallest) / span)
        rects = []
        holes = []
        for block in seg.get("blocks", []):
            size = int(block.get("size", 0))
            addr = int(block.get("address", base))
            bx = (addr - base) * w / max(total, 1)
            bw = max(0.5, size * w / max(total, 1))
            allocated = str(block.get("state", "")).startswith("active")
            if not allocated:
                holes.append(size)
            title = html.escape(
                f"{'allocated' if allocated else 'free'} {_bytes(size)} at {addr:#x}"
                + (f" (asked {_bytes(int(block.get('requested_size', 0)))})" if allocated
                   else "")
                + ("\n" + _frames_text(block.get("frames") or []) if block.get("frames")
                   else "")
            )
            cls = "blk-alloc" if allocated else "blk-free"
            rects.append(f'<rect x="{bx:.1f}" y="0" width="{bw:.1f}" height="18" '
                         f'class="{cls}"><title>{title}</title></rect>')
        free = sum(holes)
        largest = max(holes, default=0)
        frag = 0.0 if not free else 1 - largest / free
        label = (f"{base:#x}: {_bytes(total)}, {_bytes(total - free)} allocated, "
                 f"{_bytes(free)} free in {len(holes)} hole(s), largest {_bytes(largest)}, "
                 f"fragmentation {frag:.3f}"
                 + (", expandable" if seg.get("is_expandable") else "")
                 + (f", tier {seg['tier']}" if seg.get("tier") else "")
                 + (", offloaded (the pool sleeps: no page mapped, its data on the host)"
                    if seg.get("offloaded") else ""))
        rows.append(f'<div class="seg"><div class="seglabel">{html.escape(label)}</div>'
                    f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + 2:.0f}" height="20">'
                    f'<rect x="0" y="0" width="{w:.1f}" height="18" class="segbg"/>'
                    f'{"".join(rects)}</svg></div>')
    more = len(segments) - len(shown)
    if more > 0:
        rows.append(f'<p class="muted">{more} smaller segment(s) not drawn.</p>')
    return "".join(rows)


_CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222;background:#fff;max-width:1300px}
svg{max-width:100%;height:auto} .seglabel{overflow-wrap:anywhere}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
table.sum td{padding:2px 12px 2px 0} table.sum td:first-child{color:#555}
.grid{stroke:#ddd;stroke-width:1} .axis{font-size:11px;fill:#555}
.band:hover{opacity:.6}
.others{fill:#c8c8c8} .oom{stroke:#d00;stroke-width:1.5;stroke-dasharray:4 3}
.seg{margin:6px 0} .seglabel{font-size:12px;color:#333;margin-bottom:2px}
.segbg{fill:#f3f3f3} .blk-alloc{fill:#4e79a7;stroke:#fff;stroke-width:.5}
.blk-free{fill:#fbe3c0;stroke:#e0a040;stroke-width:.5} .muted{color:#777}
table.grid{border-collapse:collapse;font-size:13px}
table.grid th,table.grid td{border:1px solid #ddd;padding:2px 8px;text-align:left}
table.grid th{background:#f3f3f3} h3{font-size:14px;margin:16px 0 6px}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:middle}
"""


def _sleep_row(snapshot: dict[str, Any]) -> str | None:
    """What a sleep would free, in words, from the figures ``memory_snapshot`` recorded (the
    pool's own ``sleep_estimate()``); None for a snapshot without them."""
    sleep = (snapshot.get("rrmm") or {}).get("sleep")  # checked by normalize()
    if sleep is None:
        return None
    released, copied = sleep.get("released_bytes", 0), sleep.get("copied_bytes", 0)
    discarded = sleep.get("discarded_bytes", 0)
    words = (f"{_bytes(released)} of device memory: {_bytes(copied)} of live data copied to "
             f"host memory, {_bytes(sleep.get('free_page_bytes', 0))} of free pages "
             f"released without a copy")
    return words + (f", {_bytes(discarded)} tagged discard" if discarded else "")


def _clock(at: float) -> str:
    """A ledger event's time (seconds since the epoch) as UTC clock time."""
    try:
        stamp = datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{at:.3f} s"
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _shared_gpu_html(ledger: dict[str, Any]) -> str:
    """The section "Processes on this GPU": a row per process of the ledger (share, live,
    cached, asleep, idle), then what this process asked and gave (``rrmm.shared_gpu``)."""
    esc = html.escape
    me = ledger.get("pid")
    rows = []
    for p in ledger["processes"]:
        share = "an equal part" if p["soft_share"] is None else _bytes(p["soft_share"])
        limit = "none" if p["hard_limit"] is None else (
            _bytes(p["hard_limit"]) + (f" ({p['hard_limit_from']})" if p["hard_limit_from"]
                                       else ""))
        who = f"{p['pid']}" + (" (this process)" if p["pid"] == me else "")
        cells = (who, p["name"], share, _bytes(p["live"]), _bytes(p["cached"]),
                 _bytes(p["asleep"]), "yes" if p["idle"] else "no", limit)
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    head = ("pid", "name", "soft share", "live", "cached", "asleep", "idle", "hard limit")
    table = ('<table class="grid"><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
             + "".join(rows) + "</table>") if rows else (
        '<p class="muted">No process in the ledger when the snapshot was taken.</p>')
    events = []
    for e in ledger["history"]:
        said = (_clock(e["at"]), e["kind"], str(e["peer"]) if e["peer"] else "",
                _bytes(e["bytes"]), _bytes(e["given"]), f"{1000 * e['seconds']:.1f}", e["note"])
        events.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in said) + "</tr>")
    heads = ("when", "what", "peer", "bytes", "given", "ms", "note")
    history = ('<table class="grid"><tr>' + "".join(f"<th>{h}</th>" for h in heads) + "</tr>"
               + "".join(events) + "</table>") if events else (
        '<p class="muted">Nothing asked or given yet.</p>')
    where = ledger.get("directory") or ""
    return ("<h2>Processes on this GPU</h2>"
            f"<p class=\"muted\">The GPU's ledger{' (' + esc(where) + ')' if where else ''}: "
            "each process's soft share (beyond which it is asked first to give memory back "
            "and, when idle, may be put to sleep), its bytes live, cached and asleep.</p>"
            f"{table}<h3>What this process asked and gave</h3>{history}")


def _check_device(snapshot: dict[str, Any], traces: list[Any], device: int) -> None:
    """Refuses ``device`` when the snapshot holds nothing of it (a page of hints that do not
    apply otherwise: no history recorded, no pool): its devices are those with a trace (a list,
    even empty: PyTorch writes one per device) and those its segments name."""
    devices = set(range(len(traces))) | {int(s["device"]) for s in snapshot.get("segments") or []
                                         if "device" in s}
    if devices and device not in devices:
        listed = ", ".join(str(d) for d in sorted(devices))
        raise ValueError(f"--device {device}: the snapshot has nothing of device {device}; its "
                         f"device(s): {listed}")


def render_html(snapshot: dict[str, Any], title: str = "rrmm memory snapshot",
                device: int | None = None) -> str:
    """The page for ``snapshot`` as one HTML string (no external resources).

    ``device`` picks the trace of one device (default: the first with entries) and the segments
    of that device (segments without a ``device`` key are shown for any device). Raises
    ValueError for a snapshot whose fields have the wrong shape (:func:`normalize`), and for a
    ``device`` the snapshot has neither a trace nor a segment of (naming the devices it has).
    """
    snapshot = normalize(snapshot)
    traces = snapshot.get("device_traces") or []
    if device is None:
        device = next((i for i, t in enumerate(traces) if t), 0)
    else:
        _check_device(snapshot, traces, device)
    trace = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot.get("segments") or []
                if s.get("device", device) == device]
    tl = build_timeline(trace)
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    allocated = sum(int(s.get("allocated_size", 0)) or sum(
        int(b.get("size", 0)) for b in s.get("blocks", [])
        if str(b.get("state", "")).startswith("active")) for s in segments)
    holes = [int(b.get("size", 0)) for s in segments for b in s.get("blocks", [])
             if not str(b.get("state", "")).startswith("active")]
    free = sum(holes)
    largest = max(holes, default=0)
    rows = [
        ("device", str(device)),
        ("history", f"{tl.events} allocation/free event(s), {len(tl.ooms)} failed; "
                    f"peak {_bytes(max(tl.totals, default=0))} in use"
         if tl.events else "none recorded (rrmm.record_memory_history() records it)"),
        ("segments", f"{len(segments)}, {_bytes(reserved)} held"),
        ("allocated", _bytes(allocated)),
        ("free in segments", (f"{_bytes(free)} in {len(holes)} hole(s), largest "
                             f"{_bytes(largest)}, fragmentation "
                             f"{0.0 if not free else 1 - largest / free:.3f}")),
    ]
    tiers: dict[str, int] = {}
    for s in segments:
        if s.get("tier"):
            tiers[s["tier"]] = tiers.get(s["tier"], 0) + int(s.get("total_size", 0))
    if tiers:
        rows.append(("tiers", ", ".join(f"{name} {_bytes(held)} held"
                                        for name, held in tiers.items())))
    sleep = _sleep_row(snapshot)
    if sleep is not None:
        rows.append(("a sleep would free", sleep))
    extra = snapshot.get("rrmm") or {}
    spill = extra.get("spill")  # checked by normalize()
    if spill is not None:
        rows.append(("spilled to host", (
            f"{_bytes(spill.get('spilled', 0))} of host pages under the pool's addresses, "
            f"{_bytes(spill.get('kept', 0))} kept for the next spill (limit "
            f"{_bytes(spill.get('limit', 0))}); {_bytes(spill.get('promoted', 0))} promoted "
            f"to the device so far")))
    ledger = extra.get("shared_gpu")  # checked by normalize()
    if ledger is not None:
        mine = next((p for p in ledger["processes"] if p["pid"] == ledger.get("pid")), None)
        rows.append(("shared GPU", f"{len(ledger['processes'])} process(es) in the ledger"
                     + ("" if mine is None else
                        f"; this one: {_bytes(mine['live'])} live, "
                        f"{_bytes(mine['cached'])} cached, {_bytes(mine['asleep'])} asleep")))
    if extra.get("source") == "log":
        rows.append(("source", ("a logging adaptor's log, replayed through a pool on simulated "
                               "memory; segments at the peak")))
    summary = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                      for k, v in rows)
    timeline = (_timeline_svg(tl) if tl.events else
                '<p class="muted">No allocation history in this snapshot.</p>')
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table class=\"sum\">{summary}</table>"
        "<h2>Active memory over time</h2>"
        "<p class=\"muted\">Each band is one allocation, stacked in the order they were made; "
        "each its own colour; hover for its size, address and stack. Grey: smaller allocations together; red "
        "dashes: failed allocations.</p>"
        f"{timeline}<h2>Segments, blocks and holes</h2>"
        "<p class=\"legend muted\"><span style=\"background:#4e79a7\"></span>allocated"
        "<span style=\"background:#fbe3c0\"></span>free (a hole)</p>"
        f"{_segments_html(segments)}"
        f"{'' if ledger is None else _shared_gpu_html(ledger)}</body></html>"
    )


def write_html(snapshot: dict[str, Any], path: str, title: str | None = None,
               device: int | None = None) -> None:
    """Writes :func:`render_html` of ``snapshot`` to ``path``."""
    page = render_html(snapshot, title or "rrmm memory snapshot", device)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
