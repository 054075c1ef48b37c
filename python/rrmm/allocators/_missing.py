"""The ImportError every hook raises when its framework is not installed (its own module, so
the hooks need not import the package ``__init__`` that imports them)."""

from __future__ import annotations

__all__ = ["missing"]


def missing(package: str, hook: str, install: str, cause: BaseException) -> ImportError:
    """The ImportError a hook raises when its framework is not installed."""
    error = ImportError(
        f"{hook} needs {package}, which could not be imported ({cause}); install it with "
        f"`{install}`"
    )
    error.name = package
    return error
