"""The stack options as a TypedDict: the keyword arguments that every entry point building a
stack kind takes (``build_stack``, ``_reinitialize``, ``replay_logs``, ``fit_logs``); their names
and types are the fields of ``rrmm::stack::StackOptions``, read once in Rust
(``src/python/resources/stack_options.rs``)."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["StackOptions"]


class StackOptions(TypedDict, total=False):
    """Options of a stack kind; a missing or None option is the kind's default."""

    initial_pool_size: int | str | None
    maximum_pool_size: int | str | None
    bins: tuple[int, int] | None
    block_size: int | str | None
    blocks: int | None
    arena_size: int | str | None
    release_threshold: int | str | None
    allocation_limit: int | str | None
    logging: bool | None
    log_file: str | None
    statistics: bool | None
    tracking: bool | None
    host_memory: int | str | None
    peer_memory: int | str | None
    peer_device: int | None
    spill_to_host: int | str | None
