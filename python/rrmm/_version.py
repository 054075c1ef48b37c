"""``__version__`` and ``__git_commit__`` (RMM's ``rmm._version``)."""

from __future__ import annotations

from importlib import resources

from rrmm._rrmm import __version__

__all__ = ["__git_commit__", "__version__"]


def _read_git_commit() -> str:
    """The commit a release was built from (the ``GIT_COMMIT`` file a release build writes into
    the package); empty in a source checkout, as RMM's."""
    try:
        return resources.files("rrmm").joinpath("GIT_COMMIT").read_text().strip()
    except (OSError, ValueError):
        return ""


__git_commit__: str = _read_git_commit()
