"""RMM's ``rmm._cuda`` path: device queries in ``gpu`` (over rrmm's driver layer)."""

from rrmm._cuda import gpu

__all__ = ["gpu"]
