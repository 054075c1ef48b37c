"""Issues 37 and 47: pause/resume of 8 GiB of PyTorch tensors, torch_memory_saver 0.0.10
(hook_mode "torch", its own pluggable allocator) beside rrmm.compat.torch_memory_saver, each
configuration in a process of its own, the link (and for disk backups the disk) measured in the
same run. Prints one JSON line per library and configuration.

    python benches/gpu/tms_compare.py [--gib 8] [--cycles 3] [--backends pinned,mmap,disk]
        [--retain off,on] [--disk-dir DIR] [--libs torch_memory_saver,rrmm]

Per configuration: each cycle's pause and resume in GB/s, whether every byte came back, the
first pause apart (rrmm makes a region's pinned pages while it grows, so its first pause should
run at the link's speed with no call asking; torch_memory_saver makes them at the pause), and
each as a share of what bounds it: the link for a CPU backup, min(link, disk) for a disk backup
(issue 47 asks >= 0.9). ``retain`` on keeps the backup between cycles (both libraries); off
gives it back at every resume (both libraries' default), so later pauses make pages again.
rrmm's rows add its pool's ``last_sleep()`` (``host_reused``, ``disk_bytes``, the step times).
Run under ``timeout``; without torch_memory_saver installed its rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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


def disk(directory: str, nbytes: int) -> dict[str, float]:
    """The directory's write speed (synced) and read speed (its pages dropped from the page
    cache first), in 64 MiB chunks, as a disk backup writes and reads."""
    chunk = os.urandom(1 << 20) * 64
    path = os.path.join(directory, "rrmm-bench-disk.bin")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    try:
        t = time.perf_counter()
        done = 0
        while done < nbytes:
            done += os.pwrite(fd, chunk, done)
        os.fsync(fd)
        write = nbytes / (time.perf_counter() - t) / 1e9
        os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        done = 0
        while done < nbytes:
            done += len(os.pread(fd, len(chunk), done))
        read = nbytes / (time.perf_counter() - t) / 1e9
    finally:
        os.close(fd)
        os.remove(path)
    return {"write_gbps": write, "read_gbps": read}


def device_used() -> int:
    """The device's used bytes (total minus free), as any process sees them: on a machine
    running only this process, its CUDA context plus what it holds."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def rss_bytes() -> int:
    """The process's resident host memory (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def one(lib: str, gib: int, cycles: int, backend: str, retain: bool,
        disk_dir: str) -> dict[str, Any]:
    import torch

    if lib == "torch_memory_saver":
        from torch_memory_saver import torch_memory_saver as saver

        saver.hook_mode = "torch"
    else:
        from rrmm.compat.torch_memory_saver import torch_memory_saver as saver
    n = gib * GIB
    row: dict[str, Any] = {"lib": lib, "gib": gib, "backend": backend, "retain": retain,
                           "link": link()}
    torch.cuda.empty_cache()
    row["context_used_bytes"] = device_used()  # the CUDA context (and PyTorch's), nothing held
    row["rss_before_bytes"] = rss_bytes()
    if backend == "disk":
        saver.set_disk_backup_dir(disk_dir)
        kwargs: dict[str, Any] = {"enable_disk_backup": True}
    else:
        kwargs = {"enable_cpu_backup": True, "cpu_backup_backend": backend}
    saver.retain_cpu_backup = retain
    with saver.region(tag="weights", **kwargs):
        weights = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(2)  # what an engine does between loading and its first pause
    pauses, resumes, reports, ok = [], [], [], True
    paused_used, rss_paused, rss_resumed = [], [], []
    for _ in range(cycles):
        t = time.perf_counter()
        saver.pause("weights")
        pauses.append(n / (time.perf_counter() - t) / 1e9)
        torch.cuda.empty_cache()
        paused_used.append(device_used())
        rss_paused.append(rss_bytes())
        if lib == "rrmm":
            import rrmm

            tagged = rrmm.mr.get_current_device_resource()
            reports.append(tagged.pool("weights").last_sleep())
        t = time.perf_counter()
        saver.resume("weights")
        torch.cuda.synchronize()
        resumes.append(n / (time.perf_counter() - t) / 1e9)
        rss_resumed.append(rss_bytes())
        ok = ok and bool(torch.all(weights == 7).item())
    row.update(pause_gbps=pauses, resume_gbps=resumes, bytes_kept=ok)
    # While paused: the device memory held beyond the context, as another process sees it
    # (issue 47 asks at most 256 MiB); the host memory held paused and after each resume.
    row.update(paused_used_bytes=paused_used,
               residual_while_paused_bytes=[u - row["context_used_bytes"] for u in paused_used],
               rss_paused_bytes=rss_paused, rss_after_resume_bytes=rss_resumed)
    if reports:
        row["last_sleeps"] = reports
    return row


def shares(row: dict[str, Any], disk_speed: dict[str, float] | None) -> None:
    """Each pause and resume as a share of what bounds it."""
    out_bound = row["link"]["d2h_gbps"]
    in_bound = row["link"]["h2d_gbps"]
    if row["backend"] == "disk" and disk_speed is not None:
        out_bound = min(out_bound, disk_speed["write_gbps"])
        in_bound = min(in_bound, disk_speed["read_gbps"])
    row["pause_share"] = [g / out_bound for g in row["pause_gbps"]]
    row["resume_share"] = [g / in_bound for g in row["resume_gbps"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=int, default=8)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--backends", default="pinned,mmap,disk")
    p.add_argument("--retain", default="off,on")
    p.add_argument("--libs", default="torch_memory_saver,rrmm")
    p.add_argument("--disk-dir", default=os.environ.get("TMS_DISK_BACKUP_DIR")
                   or tempfile.gettempdir())
    p.add_argument("--one", default=None)
    p.add_argument("--backend", default="pinned")
    p.add_argument("--retain-one", default="off")
    args = p.parse_args()
    if args.one:
        row = one(args.one, args.gib, args.cycles, args.backend, args.retain_one == "on",
                  args.disk_dir)
        print(json.dumps(row), flush=True)
        return
    backends = args.backends.split(",")
    disk_speed = disk(args.disk_dir, args.gib * GIB) if "disk" in backends else None
    if disk_speed is not None:
        print(json.dumps({"disk": args.disk_dir, **disk_speed}), flush=True)
    for backend in backends:
        for retain in args.retain.split(","):
            for lib in args.libs.split(","):
                cmd = [sys.executable, __file__, "--one", lib, "--gib", str(args.gib),
                       "--cycles", str(args.cycles), "--backend", backend, "--retain-one",
                       retain, "--disk-dir", args.disk_dir]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                      check=False)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if not lines:
                    print(json.dumps({"lib": lib, "backend": backend, "retain": retain,
                                      "error": proc.stderr[-1500:]}), flush=True)
                    continue
                row = json.loads(lines[-1])
                shares(row, disk_speed)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
