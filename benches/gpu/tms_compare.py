"""Issue 37: pause/resume with a CPU backup, torch_memory_saver 0.0.10 (hook_mode "torch", its own
pluggable allocator) beside rrmm.compat.torch_memory_saver, each in a process of its own, the
link measured in the same run. Prints one JSON line per library.

    python benches/gpu/tms_compare.py [--gib 8] [--cycles 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

GIB = 1 << 30


def link() -> dict[str, float]:
    import torch

    n = 2 * GIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = {}
    for name, (dst, src) in {"d2h_gbps": (host, dev), "h2d_gbps": (dev, host)}.items():
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        out[name] = n / best / 1e9
    return out


def one(lib: str, gib: int, cycles: int) -> dict[str, Any]:
    import torch

    if lib == "torch_memory_saver":
        from torch_memory_saver import torch_memory_saver as saver

        saver.hook_mode = "torch"
    else:
        from rrmm.compat.torch_memory_saver import torch_memory_saver as saver
    n = gib * GIB
    row: dict[str, Any] = {"lib": lib, "gib": gib, "link": link()}
    with saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    pauses, resumes, ok = [], [], True
    for _ in range(cycles):
        t = time.perf_counter()
        saver.pause("weights")
        pauses.append(n / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        saver.resume("weights")
        torch.cuda.synchronize()
        resumes.append(n / (time.perf_counter() - t) / 1e9)
        ok = ok and bool(torch.all(weights == 7).item())
    row.update(pause_gbps=pauses, resume_gbps=resumes, bytes_kept=ok)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=int, default=8)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--one", default=None)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.gib, args.cycles)), flush=True)
        return
    for lib in ("torch_memory_saver", "rrmm"):
        proc = subprocess.run([sys.executable, __file__, "--one", lib, "--gib", str(args.gib),
                               "--cycles", str(args.cycles)], capture_output=True, text=True,
                              timeout=300, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        print(lines[-1] if lines else json.dumps({"lib": lib, "error": proc.stderr[-1500:]}),
              flush=True)


if __name__ == "__main__":
    main()
