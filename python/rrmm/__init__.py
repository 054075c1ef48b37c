"""rrmm: a fast CUDA device-memory manager in Rust with RMM's Python API.

Code written for RMM runs with ``import rrmm as rmm``.
"""

from __future__ import annotations

from rrmm import mr, statistics
from rrmm._logging import (
    flush_logger,
    get_flush_level,
    get_logging_level,
    level_enum,
    set_flush_level,
    set_logging_level,
    should_log,
)
from rrmm._rrmm import __version__, parse_bytes
from rrmm._snapshot import memory_snapshot
from rrmm.mr import disable_logging, enable_logging, get_log_filenames
from rrmm.pylibrmm.device_buffer import DeviceBuffer
from rrmm.rmm import (
    RMMError,
    is_initialized,
    register_reinitialize_hook,
    reinitialize,
    unregister_reinitialize_hook,
)

__all__ = [
    "DeviceBuffer",
    "RMMError",
    "__version__",
    "disable_logging",
    "enable_logging",
    "flush_logger",
    "get_flush_level",
    "get_log_filenames",
    "get_logging_level",
    "is_initialized",
    "level_enum",
    "memory_snapshot",
    "mr",
    "parse_bytes",
    "register_reinitialize_hook",
    "reinitialize",
    "set_flush_level",
    "set_logging_level",
    "should_log",
    "statistics",
    "unregister_reinitialize_hook",
]
