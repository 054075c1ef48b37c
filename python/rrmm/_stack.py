"""Building resource stacks by kind: the one builder behind ``reinitialize``, the Dask plugin and
``rrmm replay``.

The kinds and their steps live in the Rust crate (``rrmm::stack``): a kind turns options into
steps, each an ``rrmm.mr`` class and its keyword arguments, bottom to top. Here each step is
made with that class, so the objects are RMM's types (``PoolMemoryResource`` over
``ManagedMemoryResource``, with ``upstream_mr``); the replay builds the same steps in Rust.
"""

from __future__ import annotations

from typing import Any

from rrmm import _rrmm
from rrmm import mr as _mr

__all__ = ["build", "kinds"]


def kinds() -> dict[str, str]:
    """Every kind's name and one-line summary."""
    return dict(_rrmm._stack_kinds())


def build(kind: str, *, simulate: int | None = None, **options: Any) -> _mr.DeviceMemoryResource:
    """The stack of ``kind`` (``"pool"``, ``"managed_pool"``, ``"expandable"``, ``"arena"``, ...;
    ``kinds()`` lists them) with ``options`` (``initial_pool_size``, ``maximum_pool_size``,
    ``bins``, ``block_size``, ``blocks``, ``arena_size``, ``release_threshold``,
    ``allocation_limit``, ``log_file``), on the current device or a simulated device of
    ``simulate`` bytes. Returns the top resource; each resource's ``upstream_mr`` is the one
    below.

    Raises ValueError for an unknown kind or option, and what the resources raise (RMM's size
    messages, MemoryError).
    """
    top: Any = None
    for class_name, kwargs in _rrmm._stack_plan(kind, simulate=simulate, **options):
        cls = getattr(_mr, class_name)
        kwargs = {k: _resource(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
        top = cls(**kwargs) if top is None else cls(top, **kwargs)
    return top


def _resource(step: tuple[str, dict[str, Any]]) -> _mr.DeviceMemoryResource:
    """A resource argument of a step (a fallback's alternate): a source resource, built from its
    own ``(class, kwargs)``."""
    class_name, kwargs = step
    resource: _mr.DeviceMemoryResource = getattr(_mr, class_name)(**kwargs)
    return resource
