"""RMM's ``rmm.pylibrmm.memory_resource.experimental``."""

from rrmm._mr_experimental import CudaAsyncManagedMemoryResource

__all__ = ["CudaAsyncManagedMemoryResource"]
