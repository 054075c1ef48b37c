"""``rrmm.host_pages``: the process's one supply of host pages (rrmm extension).

Sleeps' host copies (``offload()``), and later the pinned pools and host tiers, take their host
pages from one supply: ranges made once (huge pages on the GPU's NUMA node, faulted in by many
threads, registered with the driver once), handed out, and kept when given back, so the next
sleep copies at the link's speed into pages made before. What is kept between uses is bounded
by :func:`set_keep_limit` and given back by :func:`give_back`; every range is checked against
the host's room (cgroup limits included) before a page is touched.

``mr.prepare_sleep()`` makes the pages of a pool's next sleep ready ahead of need;
:func:`prepare` makes a range of any size ready.
"""

from __future__ import annotations

from typing import Literal

from rrmm import _rrmm
from rrmm._rrmm import parse_bytes
from rrmm._sleep_types import HostPageFigures


def prepare(
    nbytes: int | str,
    *,
    kind: Literal["pinned", "plain"] = "pinned",
    device: int | None = None,
    wait: bool = False,
) -> None:
    """Makes a range of ``nbytes`` ready ahead of need on a thread of its own (``wait``: returns
    once it is made). ``kind="pinned"`` registers it with the driver (near ``device``, default
    the current one); ``"plain"`` pages serve host memory pools. Nothing is made when a free
    or preparing range already holds ``nbytes``. A range the host has no room for is not made
    (the sleep that needs it reports the error)."""
    _rrmm.host_pages_prepare(parse_bytes(nbytes), kind, device, wait)


def wait() -> None:
    """Waits until no range is being made in the background."""
    _rrmm.host_pages_wait()


def give_back(keep: int | str = 0) -> int:
    """Gives free ranges back to the OS until at most ``keep`` bytes stay free (the largest
    ranges that fit in ``keep`` stay); returns the bytes given back. Ranges in use are not
    touched."""
    return _rrmm.host_pages_give_back(parse_bytes(keep))


def set_keep_limit(nbytes: int | str | None) -> None:
    """The most bytes kept free between uses (``None``, the default: as many as the largest
    range handed out so far, one sleep's copy, which the next sleep takes again). Gives back
    what is over it now."""
    _rrmm.host_pages_set_keep_limit(None if nbytes is None else parse_bytes(nbytes))


def figures() -> HostPageFigures:
    """What the supply holds (free, in use, being made) and has done (made, reused, given
    back)."""
    return _rrmm.host_pages_figures()


def room() -> int:
    """Bytes of host memory the process may still use now: the host's available memory,
    capped by its control groups' limits (0 where unknown). What ``spill_to_host=True`` takes
    as its limit."""
    return int(_rrmm.host_pages_room())


__all__ = [
    "HostPageFigures",
    "figures",
    "give_back",
    "prepare",
    "room",
    "set_keep_limit",
    "wait",
]
