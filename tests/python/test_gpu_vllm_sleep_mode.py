"""Issue 47 on a GPU: the sleep-mode backend ``rrmm`` driven as vLLM's worker drives it, with
PyTorch tensors allocated through rrmm's allocator in the tags' pools. Skipped without a GPU
(and without PyTorch; the factory test without vLLM 0.33 or later); the CPU side (the calls
against a model of vLLM's behaviour, the signatures, the plugin) is
``test_vllm_sleep_mode.py``. Each case runs ``vllm_engine_cycles.py`` in a process of its own.

- 100 cycles alternating levels 1 and 2, a third of them waking the weights before the KV
  cache: every suspend gives the weights' and the KV cache's device memory back; after every
  resume the weights (level 1; reloaded after level 2), the runtime state and two CUDA graphs
  (one in the ``cudagraph`` tag, one in PyTorch's own pool) replay bit-exact;
- a ``torch.compile``'d function is not compiled again after a cycle
  (``preserves_compiled_artifacts()``);
- vLLM's own ``load_general_plugins()`` and ``SleepModeBackendFactory.create_backend`` make the
  backend, and ``get_mem_allocator_instance()`` is rrmm's allocator (``RRMM_AS_VLLM_CUMEM=1``);
- ``release_pools()`` at shutdown, with tags asleep, and the process exits cleanly.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

pytestmark = pytest.mark.skipif(not conftest.gpu_available(), reason=conftest.gpu_skip_reason())

DRIVER = Path(__file__).with_name("vllm_engine_cycles.py")


def run_cycles(*args: str, timeout: int = 600) -> str:
    pytest.importorskip("torch")
    env = dict(os.environ, RRMM_AS_VLLM_CUMEM="1")
    code = ("import _rrmm_as_engines, runpy, sys; _rrmm_as_engines.install_from_environment(); "
            f"sys.argv = {[str(DRIVER), *args]!r}; runpy.run_path(sys.argv[0], "
            "run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False, cwd=DRIVER.parent)
    assert run.returncode == 0, f"{args}: {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert run.stdout.rstrip().endswith("ok"), run.stdout
    for line in run.stdout.splitlines():
        if line.startswith("skip: "):
            pytest.skip(line.removeprefix("skip: "))
    return run.stdout


def test_gpu_100_cycles_at_both_levels_keep_every_byte_and_the_cuda_graphs() -> None:
    assert "100 cycles" in run_cycles("cycles", "100")


def test_gpu_a_compiled_function_survives_a_cycle_uncompiled() -> None:
    run_cycles("compiled")


def test_gpu_vllms_factory_makes_the_backend_over_rrmms_allocator() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    run_cycles("factory")


def test_gpu_release_pools_at_shutdown_exits_cleanly() -> None:
    run_cycles("shutdown")
