"""Memory resources and the per-device current resource (RMM's ``rmm.mr``)."""

from __future__ import annotations

import warnings
from typing import Any

from rrmm import _rrmm
from rrmm._rrmm import (
    AlignedResourceAdaptor,
    BinningMemoryResource,
    CallbackMemoryResource,
    CudaAsyncMemoryResource,
    CudaAsyncViewMemoryResource,
    CudaMemoryResource,
    DeviceMemoryResource,
    ExpandableMemoryResource,
    FailureCallbackResourceAdaptor,
    FixedSizeMemoryResource,
    LimitingResourceAdaptor,
    LoggingResourceAdaptor,
    ManagedMemoryResource,
    PinnedHostMemoryResource,
    PoolMemoryResource,
    PrefetchResourceAdaptor,
    SamHeadroomMemoryResource,
    SimulatedMemoryResource,
    StatisticsResourceAdaptor,
    SystemMemoryResource,
    TrackingResourceAdaptor,
    UpstreamResourceAdaptor,
    available_device_memory,
    get_current_device_resource,
    get_per_device_resource,
    is_initialized,
    set_current_device_resource,
    set_per_device_resource,
)

__all__ = [
    "AlignedResourceAdaptor",
    "BinningMemoryResource",
    "CallbackMemoryResource",
    "CudaAsyncMemoryResource",
    "CudaAsyncViewMemoryResource",
    "CudaMemoryResource",
    "DeviceMemoryResource",
    "ExpandableMemoryResource",
    "FailureCallbackResourceAdaptor",
    "FixedSizeMemoryResource",
    "LimitingResourceAdaptor",
    "LoggingResourceAdaptor",
    "ManagedMemoryResource",
    "PinnedHostMemoryResource",
    "PoolMemoryResource",
    "PrefetchResourceAdaptor",
    "SamHeadroomMemoryResource",
    "SimulatedMemoryResource",
    "StatisticsResourceAdaptor",
    "SystemMemoryResource",
    "TrackingResourceAdaptor",
    "UpstreamResourceAdaptor",
    "available_device_memory",
    "disable_logging",
    "enable_logging",
    "get_current_device_resource",
    "get_current_device_resource_type",
    "get_log_filenames",
    "get_per_device_resource",
    "get_per_device_resource_type",
    "is_initialized",
    "set_current_device_resource",
    "set_per_device_resource",
]

# Resources that arrive from other parts of rrmm; present when the extension has them.
_OPTIONAL = ["ArenaMemoryResource"]
for _name in _OPTIONAL:
    if hasattr(_rrmm, _name):
        globals()[_name] = getattr(_rrmm, _name)
        __all__.append(_name)
del _name


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


def _initialize(
    pool_allocator: bool | str = False,
    managed_memory: bool = False,
    initial_pool_size: int | str | None = None,
    maximum_pool_size: int | str | None = None,
    devices: int | list[int] = 0,
    logging: bool = False,
    log_file_name: str | None = None,
) -> None:
    """The work of ``rrmm.reinitialize`` after its hooks ran."""
    for value in (initial_pool_size, maximum_pool_size):
        if value is not None:
            _rrmm.parse_bytes(value) if isinstance(value, str) else _check_int(value)
    expandable = _expandable_requested(pool_allocator)
    if expandable and managed_memory:
        raise ValueError(
            "reinitialize: managed memory cannot be mapped into a virtual address range, so "
            "pool_allocator='expandable' cannot use managed_memory=True; use "
            "pool_allocator=True for a pool over managed memory"
        )
    if isinstance(devices, int):
        devices = [devices]
    _rrmm._clear_per_device_resources()
    if _rrmm.device_count() == 0:
        warnings.warn(
            "rrmm.reinitialize: no CUDA device is available "
            f"({_rrmm.driver_error() or 'no devices'}); no resource was set",
            RuntimeWarning,
            stacklevel=3,
        )
        return

    def build(device: int) -> Any:
        upstream: DeviceMemoryResource = (
            ManagedMemoryResource() if managed_memory else CudaMemoryResource()
        )
        mr: DeviceMemoryResource
        if expandable:
            mr = ExpandableMemoryResource(device, initial_pool_size, maximum_pool_size)
        elif pool_allocator:
            mr = PoolMemoryResource(upstream, initial_pool_size, maximum_pool_size)
        else:
            mr = upstream
        if logging:
            mr = LoggingResourceAdaptor(mr, log_file_name)
        return mr

    for device in devices:
        set_per_device_resource(device, _on_device(device, lambda d=device: build(d)))


def _expandable_requested(pool_allocator: bool | str) -> bool:
    """Whether ``pool_allocator`` asks for the expandable pool (``"expandable"``); other
    strings are an error, booleans keep RMM's meaning."""
    if isinstance(pool_allocator, str):
        if pool_allocator.lower() != "expandable":
            raise ValueError(
                f"pool_allocator must be a bool or 'expandable', not {pool_allocator!r}"
            )
        return True
    return False


def _check_int(value: Any) -> None:
    if isinstance(value, float) or not hasattr(value, "__index__"):
        raise TypeError(f"pool sizes must be int or str, not {type(value).__name__}")
    if value.__index__() < 0:
        raise OverflowError("pool sizes must not be negative")
