"""Progress of long command-line work on standard error, the way pip and tqdm show it: a bar
redrawn in place while standard error is a terminal, nothing otherwise (a pipe, a file, CI logs)
and nothing with ``--quiet``.

``RRMM_PROGRESS=1`` forces the bar on a stream that is not a terminal and ``RRMM_PROGRESS=0``
turns it off (tests, and terminals that misreport themselves).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import IO, Self, TypeVar

__all__ = ["Progress", "progress_wanted", "track"]

T = TypeVar("T")

#: Seconds between redraws of the elapsed time while one step runs.
TICK = 0.25
#: Width of the bar in characters.
BAR = 24


def progress_wanted(stream: IO[str] | None = None, quiet: bool = False) -> bool:
    """Whether a bar is drawn on ``stream`` (default: standard error): not with ``quiet`` nor
    on a stream that cannot be written (standard error closed: ``2>&-``), else
    ``RRMM_PROGRESS`` (``1`` on, ``0`` off) when set, else whether ``stream`` is a terminal."""
    stream = sys.stderr if stream is None else stream
    if quiet or not _writable(stream):
        return False
    forced = os.environ.get("RRMM_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _writable(stream: IO[str] | None) -> bool:
    """Whether ``stream`` takes writes: not None (a stream closed when Python started), not
    closed, and writable where it says."""
    if stream is None:
        return False
    try:
        return not stream.closed and stream.writable()
    except (AttributeError, ValueError, OSError):
        return hasattr(stream, "write")


class Progress:
    """A bar of ``total`` steps named ``label`` (``with Progress("replay", 12) as p:`` then
    ``p.step("pool on log.csv")`` before each step). While a step runs, a background thread
    redraws its elapsed time, so work done without the GIL (the replay engine) still shows a sign
    of life. The line is cleared when the bar closes. Does nothing unless :func:`progress_wanted`.
    """

    def __init__(self, label: str, total: int, *, quiet: bool = False,
                 stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.label = label
        self.total = max(0, total)
        self.stream = sys.stderr if stream is None else stream
        wanted = progress_wanted(self.stream, quiet) if enabled is None else enabled
        self.enabled = wanted and _writable(self.stream)
        self.done = 0
        self.note = ""
        self.extra = ""
        self.started = time.monotonic()
        self.step_started = self.started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._drawn = False
        self._last_draw = 0.0

    def __enter__(self) -> Self:
        if self.enabled:
            self._ticker = threading.Thread(target=self._tick, name="rrmm-progress",
                                            daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def step(self, note: str = "") -> None:
        """Starts the next step (``note`` says what it is), counting the previous one done."""
        with self._lock:
            if self.note:
                self.done = min(self.total, self.done + 1)
            self.note = note
            self.extra = ""
            self.step_started = time.monotonic()
            self._draw()

    def advance(self, done: int, note: str = "") -> None:
        """Sets the count of steps done (for work counted in many small steps: rows, events);
        redraws at most every :data:`TICK` seconds."""
        with self._lock:
            self.done = min(self.total, max(0, done))
            self.note = note or self.note or " "
            now = time.monotonic()
            if now - self._last_draw >= TICK:
                self._draw()

    def detail(self, text: str) -> None:
        """Shows ``text`` after the current step's note (work inside one step: a replay's
        events), until the next step; redraws at most every :data:`TICK` seconds."""
        with self._lock:
            self.extra = text
            now = time.monotonic()
            if now - self._last_draw >= TICK:
                self._draw()

    def close(self) -> None:
        """Stops the redraws and clears the bar's line."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self._drawn:
                self._write("\r\x1b[K")
                self._drawn = False

    def line(self) -> str:
        """The bar as drawn now (without the carriage return)."""
        now = time.monotonic()
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * BAR)
        bar = "#" * filled + "." * (BAR - filled)
        note = f" {self.note}" if self.note else ""
        if self.extra:
            note += f": {self.extra}"
        return (f"{self.label} [{bar}] {self.done}/{self.total}{note} "
                f"({now - self.step_started:.1f}s, {now - self.started:.1f}s in all)")

    def _draw(self) -> None:
        if not self.enabled:
            return
        self._write("\r\x1b[K" + self.line())
        self._drawn = True
        self._last_draw = time.monotonic()

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError, AttributeError):
            self.enabled = False  # a closed terminal: go quiet rather than fail the work

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            with self._lock:
                if self.note:
                    self._draw()


def track(items: Iterable[T], label: str, total: int, *, quiet: bool = False,
          describe: object = None, stream: IO[str] | None = None) -> Iterator[T]:
    """Yields ``items`` with a :class:`Progress` bar over them (each item one step, described by
    ``describe(item)`` when given, else ``str(item)``)."""
    with Progress(label, total, quiet=quiet, stream=stream) as bar:
        for item in items:
            bar.step(describe(item) if callable(describe) else str(item))
            yield item
