"""``RRMM_AS_TORCH_MEMORY_SAVER=1`` and ``RRMM_AS_VLLM_CUMEM=1``: the engines' sleep APIs resolve
to rrmm's drop-in modules in this process.

Installed with rrmm's wheel next to ``rrmm_as_engines.pth``, which calls
``install_from_environment()`` at interpreter start-up only when one of the variables is set
(to anything but ``0``); without them nothing here runs, and this module imports nothing of
rrmm until the first aliased import.

- ``torch_memory_saver`` gives ``rrmm.compat.torch_memory_saver`` (the same module object).
- ``vllm.device_allocator.cumem`` gives ``rrmm.compat.vllm_cumem``; the packages above it are
  vLLM's own where vLLM is installed, else empty packages that hold only that module. vLLM's
  workers then allocate from rrmm, which the sleep-mode backend ``rrmm`` needs.

The loader and the switch's reading are ``_rrmm_as_rmm``'s (installed beside it).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

from _rrmm_as_rmm import _AliasLoader, switched_on

__all__ = ["EngineAliasFinder", "enabled", "install", "install_from_environment"]

#: The variable that turns each alias on, and the modules it maps.
SWITCHES = {
    "RRMM_AS_TORCH_MEMORY_SAVER": {"torch_memory_saver": "rrmm.compat.torch_memory_saver"},
    "RRMM_AS_VLLM_CUMEM": {"vllm.device_allocator.cumem": "rrmm.compat.vllm_cumem"},
}


def enabled(variable: str, environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether ``variable`` asks for its alias (set, and not ``0`` or empty)."""
    return switched_on(variable, environ)


class _EmptyPackageLoader(importlib.abc.Loader):
    """An empty package (a parent of an aliased module that is not installed)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []


class EngineAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves the aliased module names to rrmm's modules."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = dict(aliases)

    def _found_elsewhere(self, fullname: str, path):  # type: ignore[no-untyped-def]
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path)
            if spec is not None:
                return spec
        return None

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        real = self.aliases.get(fullname)
        if real is not None:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))
        parents = {a.rsplit(".", i)[0] for a in self.aliases for i in range(1, a.count(".") + 1)}
        if fullname in parents and self._found_elsewhere(fullname, path) is None:
            return importlib.machinery.ModuleSpec(
                fullname, _EmptyPackageLoader(), is_package=True
            )
        return None


def install(aliases: dict[str, str]) -> None:
    """Puts a finder for ``aliases`` first in ``sys.meta_path``.

    Raises ImportError when an aliased name is already imported from elsewhere.
    """
    for name in aliases:
        existing = sys.modules.get(name)
        if existing is not None and not getattr(existing, "__name__", "").startswith("rrmm"):
            raise ImportError(
                f"the real {name} is already imported in this process (from "
                f"{getattr(existing, '__file__', '?')}): set the switch in the environment "
                f"before Python starts, or import rrmm.compat's module directly"
            )
    sys.meta_path.insert(0, EngineAliasFinder(aliases))


def install_from_environment() -> None:
    """Installs the aliases whose variables are set."""
    aliases: dict[str, str] = {}
    for variable, mapping in SWITCHES.items():
        if enabled(variable):
            aliases.update(mapping)
    if aliases and not any(isinstance(f, EngineAliasFinder) for f in sys.meta_path):
        install(aliases)
