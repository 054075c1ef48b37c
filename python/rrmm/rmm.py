"""``reinitialize``, its hooks and ``RMMError`` (RMM's ``rmm.rmm``)."""

from __future__ import annotations

import warnings
from typing import Any, Callable

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
    _mr._initialize(
        pool_allocator=pool_allocator,
        managed_memory=managed_memory,
        initial_pool_size=initial_pool_size,
        maximum_pool_size=maximum_pool_size,
        devices=devices,
        logging=logging,
        log_file_name=log_file_name,
    )


def is_initialized() -> bool:
    """Whether a resource has been set (or made) for the current device."""
    return _rrmm.is_initialized()


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
