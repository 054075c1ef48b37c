"""rrmm's ``vllm.general_plugins`` entry point (``rrmm``, in rrmm's wheel): vLLM calls
``register()`` in each of its processes when it loads its general plugins, and the sleep-mode
backend ``rrmm`` (``rrmm.compat.vllm_sleep_mode``) becomes selectable with
``--sleep-mode-backend rrmm``. Nothing of vLLM is imported until ``register()`` runs, and the
backend's module only when vLLM resolves the backend. ``VLLM_PLUGINS``, where set, must name
``rrmm``."""

from __future__ import annotations

import logging

_log = logging.getLogger(__name__)

#: The name vLLM selects the backend by (``ModelConfig.sleep_mode_backend``).
BACKEND_NAME = "rrmm"
_BACKEND = ("rrmm.compat.vllm_sleep_mode", "RrmmSleepModeBackend")


def register() -> None:
    """Registers the sleep-mode backend ``rrmm`` with vLLM's ``SleepModeBackendFactory``.

    Does nothing where vLLM is not installed or predates the factory (vLLM 0.33 has it), and
    when the backend is registered already (vLLM may load its plugins more than once)."""
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
    except ImportError:
        return
    try:
        SleepModeBackendFactory.register_backend(BACKEND_NAME, *_BACKEND)
    except ValueError:
        _log.debug("sleep-mode backend %r is registered already", BACKEND_NAME)


__all__ = ["BACKEND_NAME", "register"]
