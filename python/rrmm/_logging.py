"""RMM's logging level API (``rmm.set_logging_level`` and friends), the debug log
(``$RMM_DEBUG_LOG_FILE``, else standard error), and the naming of allocation-log files."""

from __future__ import annotations

import os
import sys
from enum import IntEnum

__all__ = [
    "flush_logger",
    "get_flush_level",
    "get_logging_level",
    "level_enum",
    "set_flush_level",
    "set_logging_level",
    "should_log",
]


class level_enum(IntEnum):
    """Severity levels, as RMM's ``level_enum``."""

    trace = 0
    debug = 1
    info = 2
    warn = 3
    error = 4
    critical = 5
    off = 6


_level = level_enum.info
_flush_level = level_enum.warn


def _check(level: object) -> level_enum:
    if not isinstance(level, level_enum):
        raise TypeError(f"level must be an rrmm.level_enum, not {type(level).__name__}")
    return level


def set_logging_level(level: level_enum) -> None:
    """Sets the level below which debug-log messages are dropped."""
    global _level
    _level = _check(level)


def get_logging_level() -> level_enum:
    """The debug log's level."""
    return _level


def set_flush_level(level: level_enum) -> None:
    """Sets the level at and above which the debug log is flushed after each message."""
    global _flush_level
    _flush_level = _check(level)


def get_flush_level() -> level_enum:
    """The debug log's flush level."""
    return _flush_level


def should_log(level: level_enum) -> bool:
    """Whether a message of ``level`` would be written."""
    return _check(level) >= _level and _level != level_enum.off


def flush_logger() -> None:
    """Flushes the debug log. rrmm writes each debug-log message whole to
    ``$RMM_DEBUG_LOG_FILE`` (opened and closed per message), else to standard error, which is
    what this flushes."""
    sys.stderr.flush()


def log_file_for_device(name: str | bytes | os.PathLike[str] | None, device: int) -> str:
    """The allocation-log file of ``device``: ``name`` (``$RMM_LOG_FILE`` when None) with
    ``.dev{device}`` inserted before the extension (``rmm_log.csv`` -> ``rmm_log.dev0.csv``), as
    RMM's Python ``_append_id`` does (the naming is the Rust adaptor's, which every logging
    layer uses). ValueError when there is neither a name nor ``RMM_LOG_FILE``, or the name is
    empty; TypeError when it is not a path."""
    from rrmm import _rrmm

    return _rrmm.log_file_for_device(name, device)
