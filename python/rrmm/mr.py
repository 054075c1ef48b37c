"""Memory resources and the per-device current resource (RMM's ``rmm.mr``)."""

from __future__ import annotations

from typing import Any

from rrmm import _rrmm
from rrmm._host_buffer import get_current_host_resource, set_current_host_resource
from rrmm._rrmm import (
    AlignedResourceAdaptor,
    ArenaMemoryResource,
    BinningMemoryResource,
    CallbackMemoryResource,
    CudaAsyncMemoryResource,
    CudaAsyncViewMemoryResource,
    CudaMemoryResource,
    DeviceMemoryResource,
    ExpandableMemoryResource,
    FailureCallbackResourceAdaptor,
    FallbackResourceAdaptor,
    FixedSizeMemoryResource,
    LimitingResourceAdaptor,
    LoggingResourceAdaptor,
    ManagedMemoryResource,
    PeerMemoryResource,
    PinnedHostMemoryResource,
    PoolMemoryResource,
    PrefetchResourceAdaptor,
    SamHeadroomMemoryResource,
    SimulatedMemoryResource,
    StatisticsResourceAdaptor,
    SystemMemoryResource,
    TaggedMemoryResource,
    TieredMemoryResource,
    TrackingResourceAdaptor,
    UpstreamResourceAdaptor,
    available_device_memory,
    get_current_device_resource,
    get_per_device_resource,
    is_initialized,
    release_caches,
    set_current_device_resource,
    set_per_device_resource,
)

__all__ = [
    "AlignedResourceAdaptor",
    "ArenaMemoryResource",
    "BinningMemoryResource",
    "CallbackMemoryResource",
    "CudaAsyncMemoryResource",
    "CudaAsyncViewMemoryResource",
    "CudaMemoryResource",
    "DeviceMemoryResource",
    "ExpandableMemoryResource",
    "FailureCallbackResourceAdaptor",
    "FallbackResourceAdaptor",
    "FixedSizeMemoryResource",
    "LimitingResourceAdaptor",
    "LoggingResourceAdaptor",
    "ManagedMemoryResource",
    "PeerMemoryResource",
    "PinnedHostMemoryResource",
    "PoolMemoryResource",
    "PrefetchResourceAdaptor",
    "SamHeadroomMemoryResource",
    "SimulatedMemoryResource",
    "StatisticsResourceAdaptor",
    "SystemMemoryResource",
    "TaggedMemoryResource",
    "TieredMemoryResource",
    "TrackingResourceAdaptor",
    "UpstreamResourceAdaptor",
    "available_device_memory",
    "disable_logging",
    "enable_logging",
    "get_current_device_resource",
    "get_current_device_resource_type",
    "get_current_host_resource",
    "get_log_filenames",
    "get_per_device_resource",
    "get_per_device_resource_type",
    "is_initialized",
    "release_caches",
    "set_current_device_resource",
    "set_current_host_resource",
    "set_per_device_resource",
]

def get_per_device_resource_type(device: int) -> type:
    """The type of the resource of ``device``."""
    return type(get_per_device_resource(device))


def get_current_device_resource_type() -> type:
    """The type of the current device's resource."""
    return type(get_current_device_resource())


def _devices_with_resources() -> list[int]:
    count = max(1, _rrmm.device_count())
    return [d for d in range(count) if _rrmm.has_per_device_resource(d)]


def _on_device(device: int, make: Any) -> Any:
    """Calls ``make()`` with ``device`` current (as RMM's ``setDevice``), then restores."""
    if _rrmm.device_count() <= 1:
        return make()
    original = _rrmm._current_device()
    _rrmm._set_device(device)
    try:
        return make()
    finally:
        _rrmm._set_device(original)


def enable_logging(log_file_name: str | None = None) -> None:
    """Wraps each device's resource in a ``LoggingResourceAdaptor`` writing to ``log_file_name``
    (``$RMM_LOG_FILE`` when None), with ``.dev{N}`` inserted before the extension."""
    logging_cls = LoggingResourceAdaptor
    for device in _devices_with_resources() or [0]:
        current = get_per_device_resource(device)
        if not isinstance(current, logging_cls):
            adaptor = _on_device(device, lambda c=current: logging_cls(c, log_file_name))
            set_per_device_resource(device, adaptor)


def disable_logging() -> None:
    """Removes the ``LoggingResourceAdaptor`` of each device that has one."""
    logging_cls = LoggingResourceAdaptor
    for device in _devices_with_resources():
        current = get_per_device_resource(device)
        if isinstance(current, logging_cls):
            set_per_device_resource(device, current.get_upstream())


def get_log_filenames() -> dict[int, str | None]:
    """``{device: log file}`` for each device with a resource (None where it does not log)."""
    out: dict[int, str | None] = {}
    for device in _devices_with_resources():
        current = get_per_device_resource(device)
        if isinstance(current, LoggingResourceAdaptor):
            out[device] = current.get_file_name()
        else:
            out[device] = None
    return out


# RMM's ``rmm.mr.experimental`` submodule: ``rrmm.mr`` is a module, so its ``experimental`` part
# lives in ``rrmm._mr_experimental`` and is registered under the dotted name.
def _register_experimental() -> Any:
    import sys

    from rrmm import _mr_experimental

    sys.modules[__name__ + ".experimental"] = _mr_experimental
    return _mr_experimental


experimental = _register_experimental()
__all__.append("experimental")
