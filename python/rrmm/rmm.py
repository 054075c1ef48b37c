"""``reinitialize``, its hooks and ``RMMError`` (RMM's ``rmm.rmm``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from rrmm import _rrmm
from rrmm import mr as _mr

__all__ = [
    "RMMError",
    "is_initialized",
    "register_reinitialize_hook",
    "reinitialize",
    "unregister_reinitialize_hook",
]


class RMMError(Exception):
    """An error with a code, as RMM's ``RMMError(errcode, msg)``."""

    def __init__(self, errcode: int, msg: str) -> None:
        self.errcode = errcode
        self.msg = msg
        super().__init__(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errcode, self.msg))


_reinitialize_hooks: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []


def register_reinitialize_hook(
    func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Callable[..., Any]:
    """Registers ``func(*args, **kwargs)`` to run before every ``reinitialize``; hooks run in
    reverse order of registration. Returns ``func`` (usable as a decorator)."""
    _reinitialize_hooks.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func: Callable[..., Any]) -> None:
    """Removes every registration of ``func``."""
    _reinitialize_hooks[:] = [h for h in _reinitialize_hooks if h[0] is not func]


def reinitialize(
    pool_allocator: bool | str = False,
    managed_memory: bool = False,
    initial_pool_size: int | str | None = None,
    maximum_pool_size: int | str | None = None,
    devices: int | list[int] = 0,
    logging: bool = False,
    log_file_name: str | None = None,
) -> None:
    """Finalizes and reinitializes rrmm with new options (RMM's ``rmm.reinitialize``).

    Runs the reinitialize hooks (last registered first), forgets every per-device resource, then
    sets on each of ``devices``: ``[Logging](Pool(Managed|Cuda, initial, maximum) | Managed|Cuda)``.
    rrmm: ``pool_allocator="expandable"`` sets ``[Logging](ExpandableMemoryResource(device,
    initial, maximum))`` instead, the pool on one virtual address range that coalesces across
    growth and gives memory back with ``trim()`` (not with ``managed_memory=True``:
    ``ValueError``). Without a CUDA device it warns and sets nothing.
    """
    for func, args, kwargs in reversed(list(_reinitialize_hooks)):
        func(*args, **kwargs)
    for value in (initial_pool_size, maximum_pool_size):
        _check_size(value)
    expandable = _expandable_requested(pool_allocator)
    if expandable and managed_memory:
        raise ValueError(
            "reinitialize: managed memory cannot be mapped into a virtual address range, so "
            "pool_allocator='expandable' cannot use managed_memory=True; use "
            "pool_allocator=True for a pool over managed memory"
        )
    devices = _device_list(devices)
    if _rrmm.device_count() == 0:
        _rrmm._clear_per_device_resources()
        warnings.warn(
            "rrmm.reinitialize: no CUDA device is available "
            f"({_rrmm.driver_error() or 'no devices'}); no resource was set",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    for device in devices:
        if device >= _rrmm.device_count():
            raise ValueError(
                f"reinitialize: device {device} is out of range: this machine has "
                f"{_rrmm.device_count()} CUDA device(s); no resource was changed"
            )

    def build() -> _mr.DeviceMemoryResource:
        mr: _mr.DeviceMemoryResource
        if expandable:
            mr = _mr.ExpandableMemoryResource(None, initial_pool_size, maximum_pool_size)
        else:
            mr = _mr.ManagedMemoryResource() if managed_memory else _mr.CudaMemoryResource()
        if pool_allocator and not expandable:
            mr = _mr.PoolMemoryResource(mr, initial_pool_size, maximum_pool_size)
        if logging:
            mr = _mr.LoggingResourceAdaptor(mr, log_file_name)
        return mr

    # Every argument was checked above, before anything is forgotten. The old resources go
    # before the new ones are built, as in RMM: a new pool's default initial size is half the
    # free memory, which the old one may hold.
    _rrmm._clear_per_device_resources()
    built = [(device, _mr._on_device(device, build)) for device in devices]
    for device, mr in built:
        _mr.set_per_device_resource(device, mr)


def _device_list(devices: int | list[int]) -> list[int]:
    """The ordinals of ``devices`` (an int or a list of ints), checked before anything
    changes."""
    items = [devices] if not isinstance(devices, (list, tuple)) else list(devices)
    out = []
    for d in items:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"reinitialize: devices must be ints, not {type(d).__name__}")
        d = d.__index__()
        if d < 0:
            raise ValueError(f"reinitialize: device {d} is negative")
        out.append(d)
    return out


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


def _check_size(value: int | str | None) -> None:
    """Raises what the pool would for a bad size, before any resource is forgotten."""
    if value is None:
        return
    if not isinstance(value, str):
        if isinstance(value, float) or not hasattr(value, "__index__"):
            raise TypeError(f"pool sizes must be int or str, not {type(value).__name__}")
        value = value.__index__()
    _rrmm.parse_bytes(value)


def is_initialized() -> bool:
    """Whether a resource has been set (or made) for the current device."""
    return _rrmm.is_initialized()

