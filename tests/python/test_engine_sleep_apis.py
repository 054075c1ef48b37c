"""The engines' sleep APIs over rrmm (issue 37): torch_memory_saver's calls
(rrmm.compat.torch_memory_saver) and vLLM's CuMemAllocator (rrmm.compat.vllm_cumem), against a
model, on plain host memory with real bytes (DeviceBuffer stands for the tensors: it allocates
from the current device resource, as PyTorch's allocator does through rrmm's hook); the
documented examples run as written where they need no GPU. torch_memory_saver's calls against
a model of its documented behaviour: test_tms_compat.py."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import rrmm
from rrmm import mr
from rrmm._rrmm import _clear_per_device_resources
from rrmm.compat.torch_memory_saver import TorchMemorySaver
from rrmm.compat.vllm_cumem import CuMemAllocator

PAGE = 2 << 20


def host_pool() -> mr.ExpandableMemoryResource:
    return mr.ExpandableMemoryResource(reserve_size=64 * PAGE, page_size=PAGE, pageable_host=True)


def fill(buf: rrmm.DeviceBuffer, seed: int) -> np.ndarray:
    data = ((np.arange(buf.size, dtype=np.uint32) * 2654435761 + seed) >> 11).astype(np.uint8)
    buf.copy_from_host(data)
    return data


def same(buf: rrmm.DeviceBuffer, data: np.ndarray) -> bool:
    return bool(np.array_equal(np.frombuffer(buf.tobytes(), dtype=np.uint8), data))


@pytest.fixture(autouse=True)
def _fresh_current_resource() -> Any:
    yield
    _clear_per_device_resources()


def test_the_basic_example_pauses_the_default_region() -> None:
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region():
        pauseable = rrmm.DeviceBuffer(size=2 * PAGE)
    saver.pause()
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    assert tagged.pool("default").asleep
    with pytest.raises(RuntimeError, match="asleep"):
        pauseable.tobytes()
    saver.resume()
    assert not tagged.pool("default").asleep
    assert len(pauseable.tobytes()) == 2 * PAGE


def test_a_pause_declares_the_process_idle_on_its_shared_gpu(tmp_path: Any) -> None:
    """The engines' sleep APIs are idle points of a shared GPU's ledger (issue 38)."""
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region():
        kept = rrmm.DeviceBuffer(size=PAGE)
    tagged = mr.get_current_device_resource()
    ledger = tmp_path / "l"
    ledger.mkdir(mode=0o700)
    rrmm.shared_gpu.join(tagged, directory=ledger, device_key="engine-test")
    try:
        assert rrmm.shared_gpu.status(tagged)["idle"] is False  # type: ignore[index]
        saver.pause()
        assert rrmm.shared_gpu.status(tagged)["idle"] is True  # type: ignore[index]
        saver.resume()
        assert rrmm.shared_gpu.status(tagged)["idle"] is False  # type: ignore[index]
        assert kept.size == PAGE
    finally:
        rrmm.shared_gpu.leave(tagged)


def test_torch_memory_saver_pauses_one_tag_and_keeps_the_others_working() -> None:
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(tag="kv_cache"):
        kv = rrmm.DeviceBuffer(size=3 * PAGE)
    with saver.region(tag="weights", enable_cpu_backup=True):
        weights = rrmm.DeviceBuffer(size=PAGE)
    w = fill(weights, 1)
    fill(kv, 2)
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    assert tagged.pool("kv_cache").sleep_estimate()["copied_bytes"] == 3 * PAGE
    saver.pause("kv_cache")
    assert tagged.pool("kv_cache").asleep and not tagged.pool("weights").asleep
    assert tagged.pool("kv_cache").last_sleep()["copied_bytes"] == 0, "no backup: dropped"
    # The weights' tag keeps working: its bytes, new allocations in its region.
    assert same(weights, w)
    with saver.region(tag="weights", enable_cpu_backup=True):
        more = rrmm.DeviceBuffer(size=PAGE)
    # The paused tag refuses allocations, and so do copies of its bytes.
    with saver.region(tag="kv_cache"), pytest.raises(RuntimeError, match="asleep"):
        rrmm.DeviceBuffer(size=PAGE)
    with pytest.raises(RuntimeError, match="asleep"):
        kv.tobytes()
    with pytest.raises(RuntimeError, match="paused already"):
        saver.pause("kv_cache")
    saver.pause()  # every tag still active: the weights, backed up
    assert same_after_resume(saver, weights, w)
    del kv, more


def same_after_resume(saver: TorchMemorySaver, buf: rrmm.DeviceBuffer, data: np.ndarray) -> bool:
    saver.resume()
    return same(buf, data)


def test_region_rules_and_the_compatibility_setters() -> None:
    saver = TorchMemorySaver(make_pool=host_pool)
    with pytest.raises(TypeError, match="tag must be a str"), \
            saver.region(tag=3):  # type: ignore[arg-type]
        pass
    saver.resume("nope")  # a tag no region used: nothing to resume (as torch_memory_saver)
    with pytest.raises(ValueError, match="mutually exclusive"), \
            saver.region("d", enable_cpu_backup=True, enable_disk_backup=True):
        pass
    with pytest.raises(ValueError, match="cpu_backup_backend"), \
            saver.region("d", enable_cpu_backup=True, cpu_backup_backend="tape"):  # type: ignore[arg-type]
        pass
    with pytest.raises(ValueError, match="requires enable_cpu_backup"), \
            saver.region("d", cpu_backup_backend="mmap"):
        pass
    with saver.region("d", enable_cpu_backup=True, cpu_backup_backend="mmap"):
        pass
    saver.hook_mode = "preload"
    saver.hook_mode = "torch"
    with pytest.raises(ValueError, match="hook_mode"):
        saver.hook_mode = "ld"  # type: ignore[assignment]
    saver.memory_margin_bytes = 1 << 20
    with pytest.raises(ValueError, match="memory_margin_bytes"):
        saver.memory_margin_bytes = -1
    assert saver.enabled
    with saver.region("a", enable_cpu_backup=True):
        inside = rrmm.DeviceBuffer(size=PAGE)
        with saver.disable():
            outside = rrmm.DeviceBuffer(size=PAGE)
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    assert tagged.current_tag is None
    data = fill(inside, 5)
    saver.pause("a")
    assert same(outside, outside_data := fill(outside, 6)), "disable(): not in the region's tag"
    saver.resume("a")
    assert same(inside, data) and same(outside, outside_data)


def test_vllm_sleep_offloads_the_named_tags_and_drops_the_rest() -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    with allocator.use_memory_pool(tag="weights"):
        weights = rrmm.DeviceBuffer(size=2 * PAGE)
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = rrmm.DeviceBuffer(size=4 * PAGE)
    assert allocator.current_tag == CuMemAllocator.default_tag
    w = fill(weights, 3)
    fill(kv, 4)
    before = allocator.get_current_usage()
    assert before >= 6 * PAGE
    allocator.sleep(offload_tags=("weights",))
    assert allocator.get_current_usage() == before, "vLLM's: allocated bytes, asleep or not"
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    assert all(tagged.pool(t).movement()[0]["device_bytes"] == 0 for t in ("weights", "kv_cache"))
    assert tagged.pool("weights").last_sleep()["copied_bytes"] == 2 * PAGE
    assert tagged.pool("kv_cache").last_sleep()["copied_bytes"] == 0
    allocator.wake_up(["weights"])
    assert same(weights, w)
    allocator.wake_up()
    assert allocator.get_current_usage() == before
    allocator.discard("kv_cache")
    allocator.wake_up()
    del kv


def test_the_switch_imports_the_original_names() -> None:
    code = (
        "import torch_memory_saver, vllm.device_allocator.cumem as cumem\n"
        "import rrmm.compat.torch_memory_saver as a, rrmm.compat.vllm_cumem as b\n"
        "assert torch_memory_saver is a and cumem is b, (torch_memory_saver, cumem)\n"
        "from torch_memory_saver import torch_memory_saver as singleton\n"
        "assert singleton is a.torch_memory_saver\n"
        "from vllm.device_allocator.cumem import CuMemAllocator\n"
        "assert CuMemAllocator.get_instance() is CuMemAllocator.get_instance()\n"
    )
    env = dict(os.environ, RRMM_AS_TORCH_MEMORY_SAVER="1", RRMM_AS_VLLM_CUMEM="1")
    run = subprocess.run([sys.executable, "-c", "import _rrmm_as_engines; _rrmm_as_engines."
                          "install_from_environment()\n" + code],
                         env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    off = subprocess.run([sys.executable, "-c", "import torch_memory_saver"],
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("RRMM_AS_")},
                         capture_output=True, text=True, check=False)
    assert off.returncode != 0 or "rrmm" not in off.stdout


@pytest.mark.parametrize("region_tag", ["default", "kv_cache"])
def test_a_pause_never_touches_memory_allocated_outside_regions(region_tag: str) -> None:
    """Issue 46: torch_memory_saver never touches memory outside its regions. Memory allocated
    before, between and after regions, and inside ``disable()``, keeps its bytes and stays
    usable while every region is paused; allocations outside regions are served meanwhile."""
    saver = TorchMemorySaver(make_pool=host_pool)
    with saver.region(tag="other"):
        pass  # the first region sets rrmm's tagged resource as the device's
    before = rrmm.DeviceBuffer(size=PAGE + 3)
    with saver.region(tag=region_tag):
        inside = rrmm.DeviceBuffer(size=2 * PAGE)
        with saver.disable():
            disabled = rrmm.DeviceBuffer(size=PAGE)
    after = rrmm.DeviceBuffer(size=3 * PAGE)
    data = {id(b): fill(b, i) for i, b in enumerate([before, inside, disabled, after])}
    saver.pause()
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    assert tagged.pool(region_tag).asleep
    for b in (before, disabled, after):
        assert same(b, data[id(b)]), "outside every region: untouched"
    more = rrmm.DeviceBuffer(size=PAGE)  # outside regions: served while paused
    with pytest.raises(RuntimeError, match="asleep"):
        inside.tobytes()
    saver.resume()
    for b in (before, inside, disabled, after):
        if b is not inside:
            assert same(b, data[id(b)])
    assert more.size == PAGE
    with pytest.raises(ValueError, match="outside every region"), saver.region(
            tag="rrmm:outside-regions"):
        pass
