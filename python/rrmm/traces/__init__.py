"""Allocation logs shipped with rrmm, in RMM's CSV format (gzipped), for replay demos and tests.

- ``transformer_training``: 30 steps of a 4-layer transformer trained by PyTorch through a
  logging adaptor (about 22k events).
- ``random_10k_1mib``: RMM's random_allocations pattern, 10k allocations of up to 1 MiB.
- ``random_100k_4mib``: the same pattern, 100k allocations of up to 4 MiB.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

__all__ = ["names", "path"]


def names() -> list[str]:
    """The names of the shipped traces."""
    return sorted(p.name[: -len(".csv.gz")] for p in _HERE.glob("*.csv.gz"))


def path(name: str) -> Path:
    """The file of shipped trace ``name``; KeyError naming the choices if there is none."""
    candidate = _HERE / f"{name}.csv.gz"
    if not candidate.is_file():
        raise KeyError(f"no shipped trace {name!r}; shipped: {', '.join(names())}")
    return candidate
