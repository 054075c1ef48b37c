"""Experimental memory resources (RMM's ``rmm.mr.experimental``), importable as
``rrmm.mr.experimental``."""

from rrmm._rrmm import CudaAsyncManagedMemoryResource

__all__ = ["CudaAsyncManagedMemoryResource"]
