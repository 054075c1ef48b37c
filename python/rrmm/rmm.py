"""``reinitialize``, its hooks and ``RMMError`` (RMM's ``rmm.rmm``)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from rrmm import _rrmm, _stack
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


#: The stack kinds whose pool is the expandable one (sleep, spill).
_EXPANDABLE_KINDS = ("expandable", "any_size")


def reinitialize(
    pool_allocator: bool | str = False,
    managed_memory: bool = False,
    initial_pool_size: int | str | None = None,
    maximum_pool_size: int | str | None = None,
    devices: int | list[int] = 0,
    logging: bool = False,
    log_file_name: str | None = None,
    *,
    pinned_pool_size: int | str | None = None,
    keep_sleep_ready: bool = False,
    share_gpu: bool | dict[str, Any] | None = None,
    spill_to_host: int | str | bool | None = None,
) -> None:
    """Finalizes and reinitializes rrmm with new options (RMM's ``rmm.reinitialize``).

    Checks every argument (each refusal names the argument and the value; nothing has changed
    then, not even a hook run), runs the reinitialize hooks (last registered first), forgets
    every per-device resource, then sets on each of ``devices``: ``[Logging](Pool(Managed|Cuda,
    initial, maximum) | Managed|Cuda)``. rrmm: ``pool_allocator`` may also name any stack kind
    (``rrmm._stack.kinds()``: ``"expandable"``, the pool on one virtual address range that
    coalesces across growth and gives memory back with ``trim()``; ``"arena"``, ``"binning"``,
    ``"cuda_async"``, ...), built by the same builder as ``rrmm replay`` and the Dask plugin.
    Without a CUDA device it warns and sets nothing.

    rrmm: ``pinned_pool_size`` (bytes or a string such as ``"16GiB"``) also sets the current
    host resource (``rrmm.mr.set_current_host_resource``: ``rrmm.HostBuffer``'s default and
    CuPy's pinned allocator hook) to a pool over pinned host memory holding that much from the
    start (made fast: pages on the GPU's NUMA node, faulted in by several threads, registered
    once); left out, the host resource stays as it is.

    rrmm: ``keep_sleep_ready=True`` (with ``pool_allocator="expandable"``) keeps the host pages
    of the pool's next ``rrmm.sleep()`` ready as it grows, in the background, from the process's
    host page supply (``rrmm.host_pages``): the first sleep copies at the link's speed too.

    rrmm: ``pool_allocator="any_size"`` is the one setup for data that may not fit the GPU,
    with no size to give: the expandable pool on device memory while it lasts, then pinned
    host pages under the pool's own addresses (read in place over the link; made in the
    background from the moment the device is three quarters full, up to what the host has
    room for, or ``spill_to_host``), and the spilled data moved back to the device at safe
    points (a wake, ``rrmm.at_rest()``, a Dask task boundary; the pool's ``auto_promote``).

    rrmm: ``spill_to_host`` (with ``pool_allocator="expandable"``: bytes, a string such as
    ``"64GiB"``, or True for what the host has available now) lets each device's pool map
    pinned host pages under its own addresses once the device is full (read in place over the
    link) and ``promote()`` them back later (``ExpandableMemoryResource(spill_to_host=...)``);
    make the pages ahead with the pool's ``prepare_spill``.

    rrmm: ``share_gpu=True`` (or a dict of ``rrmm.shared_gpu.join``'s options: ``soft_share``,
    ``hard_limit``, ``name``) joins each device's ledger, so that processes sharing the GPU give
    each other memory back before anyone runs out (``rrmm.shared_gpu``); ``False`` leaves it;
    left out, ``RRMM_SHARE_GPU=1`` in the environment joins.
    """
    initial = _size(initial_pool_size, "initial_pool_size")
    maximum = _size(maximum_pool_size, "maximum_pool_size")
    pinned_size = _size(pinned_pool_size, "pinned_pool_size")
    kind = stack_kind(pool_allocator, managed_memory, refused=_NOT_FOR_REINITIALIZE)
    if keep_sleep_ready and kind not in _EXPANDABLE_KINDS:
        raise ValueError(
            f"keep_sleep_ready=True needs a pool that can sleep: pool_allocator=\"expandable\", "
            f"not the {kind!r} stack")
    spill = _spill_size(spill_to_host)
    if spill is not None and kind not in _EXPANDABLE_KINDS:
        raise ValueError(
            f"spill_to_host needs the pool that spills: pool_allocator=\"expandable\", "
            f"not the {kind!r} stack")
    if share_gpu is not None and not isinstance(share_gpu, (bool, dict)):
        raise TypeError(
            f"share_gpu must be True, False, None or a dict of options, not {share_gpu!r}")
    devices = _device_list(devices)
    if log_file_name is not None and not isinstance(log_file_name, (str, os.PathLike)):
        raise TypeError(
            f"log_file_name must be a path (str) or None, not {type(log_file_name).__name__} "
            f"{log_file_name!r}")
    if share_gpu:
        # The ledger's options, whole (keys, types, units, sizes against each device where its
        # size is known), before any resource is replaced.
        _rrmm._shared_gpu_check_options(share_gpu, devices)
    # The stack's plan whole (RMM's pool size rules: multiples of 256, initial <= maximum),
    # before a hook runs or a resource is forgotten.
    _rrmm._check_stack(kind, initial_pool_size=initial, maximum_pool_size=maximum,
                       spill_to_host=spill)
    for func, args, kwargs in reversed(list(_reinitialize_hooks)):
        func(*args, **kwargs)
    # One call into Rust: it checks the devices against the machine, forgets every per-device
    # resource (the old ones go before the new ones are built, as in RMM: a new pool's default
    # initial size is half the free memory, which the old one may hold), builds the stack on
    # each device and sets it.
    no_device = _rrmm._reinitialize(kind, devices, initial_pool_size=initial,
                                    maximum_pool_size=maximum, logging=bool(logging),
                                    log_file=None if log_file_name is None
                                    else os.fspath(log_file_name), spill_to_host=spill)
    if no_device is not None:
        warnings.warn(
            f"rrmm.reinitialize: no CUDA device is available ({no_device}); no resource was set",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    if pinned_size is not None:
        _mr.set_current_host_resource(_pinned_pool(pinned_size))
    if keep_sleep_ready:
        for device in devices:
            _mr.get_per_device_resource(device).keep_sleep_ready(True)
    if share_gpu is not None:
        from rrmm import shared_gpu

        shared_gpu._from_reinitialize(devices, share_gpu)


def _spill_size(spill_to_host: int | str | bool | None) -> int | None:
    """``spill_to_host`` in bytes: None or False (never), True (what the host has room for
    now: ``rrmm.host_pages.room()``), else a size."""
    if spill_to_host is None or spill_to_host is False:
        return None
    if spill_to_host is True:
        from rrmm import host_pages

        return host_pages.room()
    return _size(spill_to_host, "spill_to_host")


#: Pinned pools from this size on say so on a terminal while their pages are touched (seconds
#: per 10 GiB).
PINNED_NOTICE_BYTES = 4 << 30


def _pinned_pool(size: int) -> _mr.DeviceMemoryResource:
    """A pool over pinned host memory holding ``size`` bytes, with a line on standard error (a
    terminal only, cleared when done) while a large one faults its pages in."""
    from rrmm._progress import Progress

    note = f"making a pinned pool of {size / (1 << 30):.2f} GiB (touching every page)"
    with Progress("rrmm.reinitialize", 1,
                  enabled=None if size >= PINNED_NOTICE_BYTES else False) as bar:
        bar.step(note)
        return _stack.build("pinned_pool", initial_pool_size=size)


#: Stack kinds that ``reinitialize`` does not build: the simulated device needs a size, which
#: ``reinitialize`` has no argument for.
_NOT_FOR_REINITIALIZE = ("simulated",)


def stack_kind(pool_allocator: bool | str, managed_memory: bool,
               refused: tuple[str, ...] = ()) -> str:
    """The stack kind (``rrmm._stack``) of ``reinitialize``'s options: RMM's ``pool_allocator``
    and ``managed_memory`` booleans (``"cuda"``, ``"pool"``, ``"managed"``, ``"managed_pool"``),
    or rrmm's name of any kind as ``pool_allocator`` (``"expandable"``, ``"arena"``, ...;
    ``"pool"`` with ``managed_memory=True`` is ``"managed_pool"``); a kind in ``refused`` is a
    ValueError as an unknown name is."""
    if isinstance(pool_allocator, str):
        kind = pool_allocator.strip().lower().replace("-", "_")
        known = [k for k in _stack.kinds() if k not in refused]
        if kind not in known:
            raise ValueError(
                f"pool_allocator must be a bool or one of {', '.join(known)}, not "
                f"{pool_allocator!r}"
                + ("; simulated memory needs a size: set "
                   "rrmm.mr.SimulatedMemoryResource(size) with set_current_device_resource"
                   if kind == "simulated" else "")
            )
        if managed_memory:
            if kind == "expandable":
                raise ValueError(
                    "reinitialize: managed memory cannot be mapped into a virtual address range,"
                    " so pool_allocator='expandable' cannot use managed_memory=True; use "
                    "pool_allocator=True for a pool over managed memory"
                )
            if kind not in ("pool", "managed_pool", "managed"):
                raise ValueError(
                    f"reinitialize: pool_allocator={pool_allocator!r} does not go over managed "
                    "memory; managed_memory=True works with pool_allocator=True or False"
                )
            kind = "managed_pool" if kind != "managed" else kind
        return kind
    if pool_allocator:
        return "managed_pool" if managed_memory else "pool"
    return "managed" if managed_memory else "cuda"


def _size(value: int | str | None, name: str) -> int | None:
    """Size argument ``name`` as an int (strings by RMM's grammar), read by the package's one
    size reader: what the pool would raise for a bad one, naming ``name`` and the value, before
    any resource is forgotten."""
    if value is None:
        return None
    return int(_rrmm._read_size(value, name))


def _device_list(devices: int | list[int]) -> list[int]:
    """The ordinals of ``devices`` (an int or a list of ints), checked before anything
    changes."""
    items = [devices] if not isinstance(devices, (list, tuple)) else list(devices)
    out = []
    for d in items:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"reinitialize: devices must be ints, not {type(d).__name__} "
                            f"{d!r} (devices={devices!r})")
        d = d.__index__()
        if d < 0:
            raise ValueError(f"reinitialize: device {d} is negative (devices={devices!r}): "
                             "devices are ordinals 0, 1, ...")
        out.append(d)
    return out


def is_initialized() -> bool:
    """Whether a resource has been set (or made) for the current device."""
    return _rrmm.is_initialized()

