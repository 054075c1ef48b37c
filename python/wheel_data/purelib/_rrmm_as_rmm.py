"""``RRMM_AS_RMM=1``: ``import rmm`` and its submodules resolve to rrmm in this process.

Installed with rrmm's wheel next to ``rrmm_as_rmm.pth``, which calls ``install()`` at interpreter
start-up only when the environment variable ``RRMM_AS_RMM`` is set (to anything but ``0``);
without it nothing here runs. This module imports nothing of rrmm: ``rrmm`` itself is imported
on the first ``import rmm``.

A meta-path finder, first in ``sys.meta_path``, answers every ``rmm`` / ``rmm.X.Y`` import with
the module ``rrmm`` / ``rrmm.X.Y`` (the same object, so ``rmm.mr is rrmm.mr``); a name rrmm does
not have fails with ``ModuleNotFoundError`` naming both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["AliasFinder", "enabled", "install", "switched_on"]

ALIAS = "rmm"
TARGET = "rrmm"


def switched_on(variable: str, environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether the environment variable ``variable`` is set, and not ``0`` or empty."""
    value = (os.environ if environ is None else environ).get(variable, "")
    return value.strip() not in ("", "0")


def enabled(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether ``RRMM_AS_RMM`` asks for the alias (set, and not ``0`` or empty)."""
    return switched_on("RRMM_AS_RMM", environ)


class _AliasLoader(importlib.abc.Loader):
    """Loads ``rmm.X`` by importing ``rrmm.X`` and handing back that module object."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        # importlib writes the alias's spec onto the module; keep rrmm's own to restore it.
        self._spec = getattr(module, "__spec__", None)
        return module

    def exec_module(self, module: ModuleType) -> None:
        if self._spec is not None:
            module.__spec__ = self._spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``rmm`` and ``rmm.*`` to ``rrmm`` and ``rrmm.*``."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS) :]
        try:
            found = real in sys.modules or importlib.util.find_spec(real) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: RRMM_AS_RMM=1 maps rmm to rrmm, and rrmm has no "
                f"{real!r}",
                name=fullname,
            )
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(real), is_package=True
        )


def install() -> None:
    """Puts the finder first in ``sys.meta_path`` (once).

    Raises ImportError when the real ``rmm`` is already imported in this process: modules holding
    its objects would mix with rrmm's.
    """
    existing = sys.modules.get(ALIAS)
    if existing is not None and not getattr(existing, "__name__", "").startswith(TARGET):
        raise ImportError(
            "RRMM_AS_RMM=1: the real rmm is already imported in this process (from "
            f"{getattr(existing, '__file__', '?')}), so `import rmm` cannot be made to give rrmm; "
            "set RRMM_AS_RMM=1 in the environment before Python starts, or use `import rrmm as "
            "rmm`"
        )
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
