"""Building resource stacks by kind: the one builder behind ``reinitialize``, the pinned pool,
the Dask plugin, ``rrmm replay`` and the snapshot viewer.

The kinds, their typed layers and the resources live in the Rust crate (``rrmm::stack``);
``_rrmm.build_stack`` builds a kind's layers and gives each its ``rrmm.mr`` class in one call,
so the objects are RMM's types (``PoolMemoryResource`` over ``ManagedMemoryResource``, with
``upstream_mr``) with every method working.
"""

from __future__ import annotations

import functools

from rrmm import _rrmm

__all__ = ["build", "kinds"]


def kinds() -> dict[str, str]:
    """Every kind's name and one-line summary."""
    return dict(_kinds())


@functools.cache
def _kinds() -> tuple[tuple[str, str], ...]:
    """The kinds, read from Rust once (the table is fixed at build time)."""
    return tuple(_rrmm._stack_kinds())


#: The stack of ``kind`` (``"pool"``, ``"managed_pool"``, ``"expandable"``, ``"arena"``, ...;
#: ``kinds()`` lists them) with its options as keyword arguments (``initial_pool_size``,
#: ``maximum_pool_size``, ``bins``, ``block_size``, ``blocks``, ``arena_size``,
#: ``release_threshold``, ``allocation_limit``, ``logging``, ``log_file``, ``statistics``,
#: ``tracking``, ``host_memory``, ``peer_memory``, ``peer_device``), on the current device or a simulated device of ``simulate``
#: bytes; returns the top resource. A misspelt option is a TypeError; an unknown kind or a bad
#: option a ValueError; then what the resources raise (RMM's size messages, MemoryError).
build = _rrmm.build_stack
