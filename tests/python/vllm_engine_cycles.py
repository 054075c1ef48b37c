"""What ``test_gpu_vllm_sleep_mode.py`` runs, each in a process of its own (PyTorch's CUDA state,
the per-tag ``MemPool``s and the singleton stay in it): the sleep-mode backend ``rrmm`` driven
as vLLM's worker drives it, on a GPU with PyTorch.

    python vllm_engine_cycles.py cycles N     # N suspend/resume cycles at levels 1 and 2
    python vllm_engine_cycles.py compiled     # a torch.compile'd function across a cycle
    python vllm_engine_cycles.py factory      # through vLLM's own plugin loading and factory
    python vllm_engine_cycles.py shutdown     # vLLM's release_pools() at exit

Each prints ``ok`` last when every check held (an assert fails the process otherwise), or a
line ``skip: why`` where what it checks cannot run here."""

from __future__ import annotations

import sys
from typing import Any

import torch
from rrmm import mr
from rrmm._rrmm import _memory_stats
from rrmm.compat.vllm_cumem import CuMemAllocator
from rrmm.compat.vllm_sleep_mode import RrmmSleepModeBackend

MiB = 1 << 20


def tensors_in_tags(allocator: CuMemAllocator) -> dict[str, Any]:
    """The state vLLM's worker allocates, each in its tag (weights, KV cache, runtime state,
    workspace), made from seeded random numbers."""
    gen = torch.Generator(device="cuda").manual_seed(47)
    made: dict[str, Any] = {}
    for tag, nbytes in (("weights", 512 * MiB), ("kv_cache", 1024 * MiB),
                        ("runtime", 64 * MiB), ("workspace", 64 * MiB)):
        with allocator.use_memory_pool(tag=tag):
            made[tag] = torch.randn(nbytes // 4, device="cuda", generator=gen)
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    for tag, t in made.items():
        stats = _memory_stats(tagged.pool(tag))
        assert stats is not None and stats["allocated_bytes.all.current"] >= t.nbytes, tag
    return made


def cycles(n: int) -> None:
    allocator = CuMemAllocator()
    backend = RrmmSleepModeBackend(allocator)
    t = tensors_in_tags(allocator)
    weights, kv, x = t["weights"], t["kv_cache"], t["runtime"]
    weights_host = weights.cpu()  # the model source a level-2 wake reloads from
    weights_ref, x_ref = weights.clone(), x.clone()  # outside every tag: never moves
    n_x = x.numel()
    # A graph in the cudagraph tag (vLLM's graph pool, kept at every level) and one in
    # PyTorch's own graph pool (outside rrmm: how vLLM captures for other backends).
    in_tag, outside = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with allocator.cudagraph_pool() as pool, torch.cuda.graph(in_tag, pool=pool):
        out_in_tag = weights[:n_x] * x + 1.0
    with torch.cuda.graph(outside):
        out_outside = weights[:n_x] * 2.0 - x
    in_tag.replay()
    outside.replay()
    expected = (out_in_tag.clone(), out_outside.clone())
    usage = allocator.get_current_usage()
    moved = weights.nbytes + kv.nbytes
    torch.cuda.synchronize()
    for cycle in range(n):
        level = 1 + cycle % 2
        free_before = torch.cuda.mem_get_info()[0]
        backend.suspend(level)
        assert backend.state() == "SUSPENDED"
        assert torch.cuda.mem_get_info()[0] - free_before >= moved, "device memory given back"
        assert allocator.get_current_usage() == usage
        if cycle % 3 == 0:  # an RL loop's partial wake: the weights first, then the KV cache
            backend.resume(["weights"])
            assert backend.state() == "SUSPENDED" and allocator.asleep_tags() == ["kv_cache"]
            backend.resume(["kv_cache"])
        else:
            backend.resume()
        assert backend.state() == "RUNNING" and allocator.asleep_tags() == []
        if level == 2:
            weights.copy_(weights_host)  # discarded: vLLM loads the weights again
        assert torch.equal(weights, weights_ref), (cycle, level)
        assert torch.equal(x, x_ref), (cycle, level, "runtime: kept at every level")
        in_tag.replay()
        outside.replay()
        assert torch.equal(out_in_tag, expected[0]), (cycle, "graph in the cudagraph tag")
        assert torch.equal(out_outside, expected[1]), (cycle, "graph outside the tags")
        kv.fill_(float(cycle))  # the KV cache was discarded: vLLM writes it anew
        assert float(kv.min()) == float(kv.max()) == float(cycle)
    print(f"{n} cycles")


def compiled() -> None:
    """A compiled function is not compiled again after a cycle (the backend's
    ``preserves_compiled_artifacts()``)."""
    from torch._dynamo.utils import counters

    allocator = CuMemAllocator()
    backend = RrmmSleepModeBackend(allocator)
    x = tensors_in_tags(allocator)["runtime"]
    f = torch.compile(lambda a: a * 2.0 + 1.0)
    try:
        before = f(x).clone()
    except Exception as e:  # noqa: BLE001 - no compiler or Triton here: a skip
        print(f"skip: torch.compile does not run here ({type(e).__name__}: {e})")
        return
    graphs = counters["stats"]["unique_graphs"]
    for level in (1, 2):
        backend.suspend(level)
        backend.resume()
        assert torch.equal(f(x), before), level
    assert counters["stats"]["unique_graphs"] == graphs, "compiled again after a resume"


def factory() -> None:
    """vLLM loads its general plugins, its factory makes the backend ``rrmm``, and its worker's
    allocator (``get_mem_allocator_instance()``) is rrmm's: ``RRMM_AS_VLLM_CUMEM=1``."""
    from types import SimpleNamespace

    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
    except ImportError as e:
        print(f"skip: this vLLM has no sleep-mode backends (vLLM 0.33 has them): {e}")
        return
    from vllm.device_allocator import get_mem_allocator_instance
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackend
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    backend = SleepModeBackendFactory.create_backend(SimpleNamespace(sleep_mode_backend="rrmm"))
    assert isinstance(backend, RrmmSleepModeBackend) and isinstance(backend, SleepModeBackend)
    allocator = get_mem_allocator_instance()
    assert allocator is CuMemAllocator.get_instance()
    t = tensors_in_tags(allocator)  # type: ignore[arg-type]
    ref = t["weights"].clone()
    backend.suspend(1)
    backend.resume(["weights"])
    assert backend.state() == "SUSPENDED"
    backend.resume()
    assert backend.state() == "RUNNING" and torch.equal(t["weights"], ref)


def shutdown() -> None:
    """vLLM's worker calls ``release_pools()`` at shutdown; the process then exits cleanly."""
    allocator = CuMemAllocator.get_instance()
    kept = tensors_in_tags(allocator)  # alive at exit, as an engine's are
    RrmmSleepModeBackend(allocator).suspend(1)
    allocator.release_pools()
    allocator.release_pools()
    assert len(kept) == 4


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "cycles":
        cycles(int(sys.argv[2]))
    else:
        {"compiled": compiled, "factory": factory, "shutdown": shutdown}[what]()
    print("ok")
