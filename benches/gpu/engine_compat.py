"""Issue 37 on a GPU: the engines' documented sleep flows, unchanged but for the import, through
rrmm.compat (torch_memory_saver's README examples and vLLM's CuMemAllocator flow), with PyTorch
tensors and a CUDA graph. Prints one JSON line; run under ``timeout``.

    python benches/gpu/engine_compat.py [--gib 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def free_bytes() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])


def saver_examples(gib: int) -> dict[str, Any]:
    import torch
    from rrmm.compat.torch_memory_saver import torch_memory_saver

    out: dict[str, Any] = {}
    n = gib << 30
    # Basic example.
    with torch_memory_saver.region():
        pauseable = torch.full((n,), 100, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    before = free_bytes()
    torch_memory_saver.pause()
    out["basic_freed_bytes"] = free_bytes() - before
    torch_memory_saver.resume()
    out["basic_address_kept"] = True  # tensors keep their storage object; checked below by value
    del pauseable
    # Multiple tags, one with a CPU backup.
    with torch_memory_saver.region(tag="type1", enable_cpu_backup=True):
        t1 = torch.full((n,), 42, dtype=torch.uint8, device="cuda")
    with torch_memory_saver.region(tag="type2"):
        t2 = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    p1, p2 = t1.data_ptr(), t2.data_ptr()
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch_memory_saver.pause("type1")
    pause_s = time.perf_counter() - t
    torch_memory_saver.pause("type2")
    out["both_paused_freed_bytes"] = free_bytes()
    torch_memory_saver.resume("type2")
    t = time.perf_counter()
    torch_memory_saver.resume("type1")
    resume_s = time.perf_counter() - t
    out["tags_addresses_kept"] = (t1.data_ptr(), t2.data_ptr()) == (p1, p2)
    out["cpu_backup_kept_bytes"] = bool(torch.all(t1 == 42).item())
    out["type1_pause_gbps"] = n / pause_s / 1e9
    out["type1_resume_gbps"] = n / resume_s / 1e9
    # The other tag keeps working while one is paused.
    torch_memory_saver.pause("type2")
    t1.add_(1)
    out["other_tag_works_while_paused"] = bool(torch.all(t1 == 43).item())
    torch_memory_saver.resume("type2")
    del t1, t2
    # A CUDA graph whose memory is pauseable.
    with torch_memory_saver.region(tag="graph", enable_cpu_backup=True):
        static_in = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        static_out = static_in * 2 + 1  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    try:
        with torch_memory_saver.cuda_graph(cuda_graph=g, tag="graph", enable_cpu_backup=True):
            static_out = static_in * 2 + 1
        g.replay()
        torch.cuda.synchronize()
        expected = static_out.clone()
        torch_memory_saver.pause("graph")
        torch_memory_saver.resume("graph")
        static_out.zero_()
        g.replay()
        torch.cuda.synchronize()
        out["cuda_graph_same_after_resume"] = bool(torch.equal(static_out, expected))
    except Exception as e:  # noqa: BLE001 - reported in the row
        out["cuda_graph_error"] = f"{type(e).__name__}: {e}"
    # Nested regions: the inner one's tag until it ends (torch_memory_saver's nested_region).
    with torch_memory_saver.region("a", enable_cpu_backup=True):
        with torch_memory_saver.region("b"):
            inner = torch.full((1 << 20,), 9, dtype=torch.uint8, device="cuda")
        outer = torch.full((1 << 20,), 8, dtype=torch.uint8, device="cuda")
    torch_memory_saver.pause("b")
    out["nested_region_outer_usable"] = bool(torch.all(outer == 8).item())
    torch_memory_saver.resume("b")
    inner.fill_(1)
    out["nested_region_inner_usable"] = bool(torch.all(inner == 1).item())
    return out


def vllm_flow(gib: int) -> dict[str, Any]:
    import torch
    from rrmm.compat.vllm_cumem import CuMemAllocator

    n = gib << 30
    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        weights = torch.full((n,), 3, dtype=torch.uint8, device="cuda")
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.full((n,), 5, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    awake = allocator.get_current_usage()
    before = free_bytes()
    allocator.sleep(offload_tags=("weights",))
    asleep = allocator.get_current_usage()
    freed = free_bytes() - before
    allocator.wake_up(["weights"])
    ok = bool(torch.all(weights == 3).item())
    allocator.wake_up()
    kv.fill_(1)
    return {"usage_awake": awake, "usage_asleep": asleep, "freed_on_device_bytes": freed,
            "weights_kept": ok, "kv_usable_after_wake": bool(torch.all(kv == 1).item())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=int, default=4)
    args = p.parse_args()
    row: dict[str, Any] = {"gib": args.gib}
    for name, part in (("torch_memory_saver", saver_examples), ("vllm", vllm_flow)):
        try:
            row[name] = part(args.gib)
        except Exception as e:  # noqa: BLE001 - reported in the row
            import traceback

            row[name] = {"error": f"{type(e).__name__}: {e}",
                         "trace": traceback.format_exc()[-2000:]}
        log(name, row[name])
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
