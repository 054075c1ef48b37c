"""RMM's ``rmm.pylibrmm.memory_resource._memory_resource``: the resources, plus ``_flush_logs``."""

from __future__ import annotations

from rrmm import _rrmm
from rrmm.mr import *
from rrmm.mr import LoggingResourceAdaptor, get_per_device_resource
from rrmm.mr import __all__ as _mr_all

__all__ = [*_mr_all, "_flush_logs"]  # noqa: PLE0604


def _flush_logs() -> None:
    """Flushes every per-device resource that is a ``LoggingResourceAdaptor``."""
    for device in range(max(1, _rrmm.device_count())):
        if _rrmm.has_per_device_resource(device):
            mr = get_per_device_resource(device)
            if isinstance(mr, LoggingResourceAdaptor):
                mr.flush()
