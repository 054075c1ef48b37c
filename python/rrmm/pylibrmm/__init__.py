"""RMM's ``rmm.pylibrmm`` paths: ``stream``, ``device_buffer``, ``cuda_stream_pool``,
``memory_resource``."""

from rrmm.pylibrmm import cuda_stream_pool, device_buffer, memory_resource, stream
from rrmm.pylibrmm.cuda_stream_pool import CudaStreamPool
from rrmm.pylibrmm.device_buffer import DeviceBuffer
from rrmm.pylibrmm.stream import Stream

__all__ = [
    "CudaStreamPool",
    "DeviceBuffer",
    "Stream",
    "cuda_stream_pool",
    "device_buffer",
    "memory_resource",
    "stream",
]
