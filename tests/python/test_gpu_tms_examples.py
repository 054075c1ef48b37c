"""torch_memory_saver's own examples (its ``test/examples/*.py``, as its ``test/test_examples.py``
runs them) under rrmm's import alias (``RRMM_AS_TORCH_MEMORY_SAVER=1``), each in a fresh
interpreter, with the environment each gets there. Skipped without a GPU, without PyTorch, or
without the examples: point ``RRMM_TMS_TESTS`` at torch_memory_saver's ``test`` directory (a
checkout of github.com/fzyzcjy/torch_memory_saver whose ``setup.py`` says 0.0.10 or 0.0.10b1,
the source of the 0.0.10 wheel).

The examples import two modules of the package that are not its API
(``torch_memory_saver.testing_utils``, "not to be used by end users, but only for tests of the
package itself", and ``torch_memory_saver.utils``): the runner gives them as small stand-ins
with the functions the examples use. Examples that reach into torch_memory_saver's private
state (its C library through ``_impl._binary_wrapper.cdll``, its ``_impl._mem_pools``) or call
its C entry points directly cannot pass with another implementation: they are expected to fail,
each with its reason, and a pass is reported (not strict). The CPU side of every call and
variable is ``test_tms_compat.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import conftest
import pytest

pytestmark = pytest.mark.skipif(not conftest.gpu_available(), reason=conftest.gpu_skip_reason())

EXAMPLES = Path(os.environ.get("RRMM_TMS_TESTS", "/nonexistent")) / "examples"

#: Reasons an example cannot pass on another implementation (it reads torch_memory_saver's
#: private state or calls its C library).
PRIVATE = {
    "cpu_backup.run": "its last part checks the release of a retained backup through "
                      "torch_memory_saver's private _impl._mem_pools, _with_region_config and "
                      "its C library's cudaHostGetFlags",
    "cpu_backup.run_backend_from_env": "reads the backend from torch_memory_saver's C library "
                                       "(_impl._binary_wrapper.cdll)",
    "cpu_backup.run_preload_backend_from_env": "reads torch_memory_saver's C library "
                                               "(_impl._binary_wrapper.cdll)",
    "nested_region.run": "reads torch_memory_saver's C library's thread-local state "
                         "(_impl._binary_wrapper.cdll)",
    "cuda_vmm_granularity.run": "calls cudaMalloc and tms_pause of torch_memory_saver's "
                                "preloaded C library directly",
    "cpu_backup.run_multi_device_mmap_restore": "rrmm's saver serves one device per process",
    "multi_device.run": "rrmm's saver serves one device per process",
    "multi_device_torch_mode.run": "rrmm's saver serves one device per process",
}

INIT = {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
#: (example.function, hook modes, environment, devices needed), as test_examples.py runs them.
CASES: list[tuple[str, tuple[str, ...], dict[str, str], int]] = [
    ("simple.run", ("preload", "torch"), {}, 1),
    ("cuda_graph.run", ("preload", "torch"), {}, 1),
    ("cpu_backup.run", ("preload", "torch"), {}, 1),
    ("cpu_backup.run_multi_device_mmap_restore", ("preload", "torch"), {}, 2),
    ("cpu_backup.run_rss", ("torch",), {}, 1),
    ("cpu_backup.run_backend_from_env", ("preload", "torch"),
     {"TMS_INIT_CPU_BACKUP_BACKEND": "mmap"}, 1),
    ("cpu_backup.run_preload_backend_from_env", ("preload",),
     {**INIT, "TMS_INIT_CPU_BACKUP_BACKEND": "mmap"}, 1),
    ("disk_backup.run", ("preload", "torch"), {}, 1),
    ("cpu_backup.run_retain_from_env", ("preload", "torch"), {"TMS_RETAIN_CPU_BACKUP": "1"}, 1),
    ("multi_device.run", ("preload", "torch"), {}, 2),
    ("multi_device_torch_mode.run", ("torch",), {}, 2),
    ("rl_example.run", ("preload", "torch"), {}, 1),
    ("training_engine.run", ("preload",), INIT, 1),
    ("cuda_vmm_granularity.run", ("preload",), {"TMS_INIT_ENABLE": "1"}, 1),
    ("nested_region.run", ("preload",), INIT, 1),
]

#: The child: the alias, stand-ins for the package's test helpers, then the example.
RUNNER = """
import importlib, os, sys, types
import _rrmm_as_engines
_rrmm_as_engines.install_from_environment()
import torch
import torch_memory_saver
assert torch_memory_saver.__name__ == "rrmm.compat.torch_memory_saver", torch_memory_saver

def _used_memory(gpu_id=0):
    free, total = torch.cuda.mem_get_info(gpu_id)
    return total - free

def get_and_print_gpu_memory(message, gpu_id=0):
    mem = torch.cuda.device_memory_used(gpu_id) if hasattr(torch.cuda, "device_memory_used") \\
        else _used_memory(gpu_id)
    print(f"GPU {gpu_id} memory: {mem / 1024 ** 3:.2f} GB ({message})")
    return mem

testing_utils = types.ModuleType("torch_memory_saver.testing_utils")
testing_utils.get_device = lambda: "cuda"
testing_utils.is_xpu = lambda: False
testing_utils.empty_cache = torch.cuda.empty_cache
testing_utils.get_and_print_gpu_memory = get_and_print_gpu_memory
utils = types.ModuleType("torch_memory_saver.utils")
utils.is_xpu = lambda: False
sys.modules["torch_memory_saver.testing_utils"] = testing_utils
sys.modules["torch_memory_saver.utils"] = utils
sys.path.insert(0, os.environ["RRMM_TMS_TESTS"])
module, function = sys.argv[1].split(".")
getattr(importlib.import_module("examples." + module), function)(hook_mode=sys.argv[2])
print("EXAMPLE OK", flush=True)
"""


def _params() -> list[object]:
    out: list[object] = []
    for name, modes, env, devices in CASES:
        for mode in modes:
            marks = []
            if name in PRIVATE:
                marks.append(pytest.mark.xfail(reason=PRIVATE[name], strict=False))
            out.append(pytest.param(name, mode, env, devices, marks=marks, id=f"{name}-{mode}"))
    return out


@pytest.mark.parametrize(("name", "hook_mode", "env", "devices"), _params())
def test_torch_memory_savers_example_under_rrmm(name: str, hook_mode: str, env: dict[str, str],
                                                devices: int) -> None:
    if not EXAMPLES.is_dir():
        pytest.skip("RRMM_TMS_TESTS does not name torch_memory_saver's test directory (with "
                    "examples/)")
    pytest.importorskip("torch")
    from rrmm import _rrmm

    if _rrmm.device_count() < devices:
        pytest.skip(f"needs {devices} GPUs")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TMS_")}
    child_env.update(env, RRMM_AS_TORCH_MEMORY_SAVER="1",
                     RRMM_TMS_TESTS=str(EXAMPLES.parent))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RUNNER), name, hook_mode],
                          env=child_env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0 and "EXAMPLE OK" in proc.stdout, (
        f"{name} ({hook_mode}) failed:\nstdout: {proc.stdout[-3000:]}\n"
        f"stderr: {proc.stderr[-3000:]}")


def test_savers_collected_and_disable_in_a_process_wide_region_do_not_abort() -> None:
    """Two things the examples found on a GPU: ``disable()`` inside ``TMS_INIT_ENABLE`` (rrmm's
    allocator is PyTorch's: PyTorch makes no MemPool of a pluggable allocator without it named)
    and a saver garbage-collected with its tags' MemPools (deleting one aborts the process).
    Memory allocated in ``disable()`` survives a pause and is not paused."""
    pytest.importorskip("torch")
    conftest.run_fresh(
        """
        import os
        os.environ.update(TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
        import torch
        import rrmm.compat.torch_memory_saver as tms

        saver = tms.torch_memory_saver
        w = torch.full((1 << 20,), 3.0, device="cuda")
        with saver.disable():
            kept = torch.full((1 << 20,), 5.0, device="cuda")
        saver.pause()
        with saver.disable():  # the process's region is paused: allocate outside it
            assert float(kept.sum()) == 5.0 * (1 << 20)
        saver.resume()
        assert float(w.sum()) == 3.0 * (1 << 20)
        print("OK")
        """,
        timeout=300,
    )
    conftest.run_fresh(
        """
        import gc
        import torch
        from rrmm._rrmm import _clear_per_device_resources
        from rrmm.compat.torch_memory_saver import TorchMemorySaver

        for _ in range(3):
            saver = TorchMemorySaver()
            with saver.region(tag="kv", enable_cpu_backup=True):
                x = torch.ones(1 << 18, device="cuda")
            saver.pause("kv")
            saver.resume("kv")
            assert float(x.sum()) == float(1 << 18)
            del x, saver
            _clear_per_device_resources()
            gc.collect()
        print("OK")
        """,
        timeout=300,
    )


def test_regions_of_one_tag_on_two_threads_at_once_with_torch() -> None:
    """PyTorch loaded, regions of one tag on two threads at the same time (and nested on one):
    each thread allocates to a MemPool no other thread is in, and every tensor keeps its
    bytes across a pause."""
    pytest.importorskip("torch")
    conftest.run_fresh(
        """
        import threading
        import torch
        from rrmm.compat.torch_memory_saver import TorchMemorySaver

        saver = TorchMemorySaver()
        meet = threading.Barrier(2, timeout=60)
        out, errors = {}, []

        def work(name, value):
            try:
                with saver.region(tag="kv", enable_cpu_backup=True):
                    meet.wait()
                    out[name] = torch.full((1 << 20,), value, device="cuda")
                    with saver.region(tag="kv", enable_cpu_backup=True):
                        out[name + "-inner"] = torch.full((1 << 10,), value, device="cuda")
                    meet.wait()
            except BaseException as e:
                errors.append(repr(e))
                meet.abort()

        t = threading.Thread(target=work, args=("b", 2.0))
        t.start()
        work("a", 1.0)
        t.join()
        assert not errors, errors
        saver.pause("kv")
        saver.resume("kv")
        for name, x in out.items():
            assert float(x.float().mean()) == (1.0 if name.startswith("a") else 2.0), name
        print("OK")
        """,
        timeout=300,
    )
