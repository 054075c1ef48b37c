"""The peer tier (issue 32) on the data-beyond-VRAM workload of ``scale.py`` (W11): CuPy
arrays whose live total is F x one device's memory, in 2 GiB arrays, written once, then read
once (stream) and twice more (reuse), with the memory beyond device 0 on a peer GPU (device 1,
NVLink or PCIe peer-to-peer) against the same beyond host memory (pinned, or managed), and
RMM's ways past the device beside them. One fresh process per (setup, F); one JSON line per
case on standard output (and appended to ``--out``).

    python3 benches/gpu/peer_tier.py                    # F = 1.15 and 1.5, every setup
    python3 benches/gpu/peer_tier.py --fs 1.15 --setups peer,host_pinned
    python3 benches/gpu/peer_tier.py --run peer --f 1.5  # one case, one JSON line

Setups (``SETUPS``): ``peer`` (device pool -> peer GPU -> pinned host, rrmm's
TieredMemoryResource), ``host_pinned`` (the same tiers without the peer: device pool -> pinned
host), ``host_managed`` (rrmm's ``fallback`` kind: device pool -> managed memory), and RMM's
``rmm_managed_pool`` and ``rmm_prefetch_pool_managed`` (RMM has no peer tier and no fallback
adaptor; these are its ways past the device). Each row carries the floor of ``scale.py`` for
its link: the bytes beyond the device crossing it once each way (reuse: once in, three times
out) at the bandwidth measured in this run (peer-to-peer copy for ``peer``, pinned host copy
otherwise), and the rest at the device's bandwidth; rrmm's tiered rows add ``tiers`` (each
tier's peak bytes and allocations, from ``tier_counts()``).

On a machine with fewer than two GPUs, or two without a peer link, it prints "no peer link"
and exits 0. The workload's functions (the case, the floor, the bandwidths, the host check) are
``scale.py``'s, imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scale  # benches/gpu, on the path above

#: The device that runs the workload and the peer GPU whose memory is the next tier.
DEVICE, PEER = 0, 1

_POOL = "mr.PoolMemoryResource(mr.CudaMemoryResource())"
#: Setup name -> (scale.run_case spec, the link its bytes beyond the device cross).
SETUPS: dict[str, tuple[str, str]] = {
    "peer": (
        (f"rrmm:expr=mr.TieredMemoryResource({_POOL}, [mr.PeerMemoryResource({PEER}, "
         f"device={DEVICE}), mr.PinnedHostMemoryResource()])"),
        "peer",
    ),
    "host_pinned": (
        f"rrmm:expr=mr.TieredMemoryResource({_POOL}, [mr.PinnedHostMemoryResource()])",
        "host",
    ),
    "host_managed": ("rrmm:fallback", "host"),
    "rmm_managed_pool": ("rmm:managed_pool", "host"),
    "rmm_prefetch_pool_managed": ("rmm:prefetch_pool_managed", "host"),
}
DEFAULT_FS = "1.15,1.5"


def peer_problem() -> str | None:
    """Why the peer tier cannot run here (no driver, fewer than two GPUs, no peer link), or
    None: rrmm's own check, the one ``PeerMemoryResource`` makes (both ways)."""
    import rrmm.mr
    from rrmm import _rrmm

    count = _rrmm.device_count()
    if count < 2:
        return f"no peer link: this machine has {count} GPU(s)"
    try:
        rrmm.mr.PeerMemoryResource(PEER, device=DEVICE)
    except RuntimeError as e:
        return str(e) if "no peer link" in str(e) else f"no peer link: {e}"
    return None


def peer_bandwidth() -> dict[str, float]:
    """Peer-to-peer copy GB/s each way between DEVICE and PEER (cudaMemcpyPeer, 4 GiB, best of
    three after one warm-up), with peer access enabled as the peer tier enables it."""
    import cupy

    n = 4 * scale.GIB
    rt = cupy.cuda.runtime
    with cupy.cuda.Device(DEVICE):
        a = cupy.cuda.Memory(n)
        try:
            rt.deviceEnablePeerAccess(PEER)
        except cupy.cuda.runtime.CUDARuntimeError:
            pass  # already enabled
    with cupy.cuda.Device(PEER):
        b = cupy.cuda.Memory(n)
        try:
            rt.deviceEnablePeerAccess(DEVICE)
        except cupy.cuda.runtime.CUDARuntimeError:
            pass

    def best(fn: Any) -> float:
        times = []
        for _ in range(4):
            rt.deviceSynchronize()
            t0 = time.perf_counter()
            fn()
            rt.deviceSynchronize()
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    out = best(lambda: rt.memcpyPeer(b.ptr, PEER, a.ptr, DEVICE, n))
    back = best(lambda: rt.memcpyPeer(a.ptr, DEVICE, b.ptr, PEER, n))
    return {"to_peer": n / out / 1e9, "from_peer": n / back / 1e9}


def run_one(name: str, f: float) -> dict[str, Any]:
    """One case in this process: ``scale.run_case`` of the setup, then the tiers' peaks."""
    import cupy

    cupy.cuda.Device(DEVICE).use()
    spec, link = SETUPS[name]
    row = scale.run_case(spec, f)
    row["name"], row["link"] = name, link
    lib = __import__(spec.split(":", 1)[0])
    top = lib.mr.get_current_device_resource()
    if hasattr(top, "tier_counts"):
        row["tiers"] = [{k: t[k] for k in ("name", "peak_bytes", "total_allocations",
                                           "refused")} for t in top.tier_counts()]
    return row


def floor(row: dict[str, Any], bw: dict[str, float], reads: int) -> float:
    """``scale.floor_s`` with the link of the row: peer-to-peer for the peer tier."""
    if row.get("link") == "peer":
        bw = dict(bw, d2h=bw["to_peer"], h2d=bw["from_peer"])
    return scale.floor_s(row, bw, reads)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", choices=sorted(SETUPS), help="one case in this process")
    ap.add_argument("--f", type=float, default=1.15)
    ap.add_argument("--fs", default=DEFAULT_FS, help="F values (default 1.15,1.5)")
    ap.add_argument("--setups", default=",".join(SETUPS), help="names of SETUPS, comma-separated")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="peer_tier.jsonl")
    args = ap.parse_args()
    problem = peer_problem()
    if problem is not None:
        print(problem, flush=True)
        return 0
    if args.run:
        print(json.dumps(run_one(args.run, args.f)), flush=True)
        return 0
    unknown = [s for s in args.setups.split(",") if s not in SETUPS]
    if unknown:
        ap.error(f"unknown setup(s) {unknown}; known: {', '.join(SETUPS)}")
    import cupy

    scale.warm_up()
    bw = dict(scale.bandwidth(), **peer_bandwidth())
    total = cupy.cuda.Device(DEVICE).mem_info[1]
    peer_total = cupy.cuda.Device(PEER).mem_info[1]
    avail = scale.host_available()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    head = {"bandwidth_GBps": bw, "device_bytes": total, "peer_bytes": peer_total,
            "host_available": avail, "device": DEVICE, "peer": PEER}
    print(json.dumps(head), flush=True)
    del cupy
    with open(args.out, "a") as out_file:
        out_file.write(json.dumps(head) + "\n")
        for f in [float(x) for x in args.fs.split(",")]:
            beyond = max(0.0, f - 1.0) * total
            for name in args.setups.split(","):
                room = peer_total if SETUPS[name][1] == "peer" else 0.85 * avail
                if beyond > room:
                    row: dict[str, Any] = {"name": name, "f": f, "skipped": (
                        f"{beyond / scale.GIB:.0f} GiB beyond the device, "
                        f"{room / scale.GIB:.0f} GiB of room on its next tier")}
                else:
                    row = scale.run_child(__file__, ["--run", name, "--f", str(f)],
                                          {"name": name, "f": f}, args.timeout)
                    if "stream_s" in row:
                        row["floor_stream_s"] = floor(row, bw, 1)
                        row["floor_reuse_s"] = floor(row, bw, 3)
                out_file.write(json.dumps(row) + "\n")
                out_file.flush()
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
