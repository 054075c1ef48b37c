"""A process of a shared GPU's ledger, driven line by line on stdin (tests/test_shared_gpu.py).

Memory: a pool over an expandable pool on plain host memory (real bytes, ``device_key`` names
the ledger) or over a simulated device. Commands (one per line, answers one JSON line):
``fill N`` (N MiB of live data, a pattern), ``cache N`` (N MiB allocated and freed: cached),
``idle``, ``busy``, ``check`` (the pattern intact?), ``figures``, ``ask N`` (MiB), ``history``,
``exit``.
"""

from __future__ import annotations

import json
import sys

import rrmm

MIB = 1 << 20


def main() -> None:
    directory, kind, soft = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "host":
        base = rrmm.mr.ExpandableMemoryResource(
            reserve_size=1 << 30, page_size=2 * MIB, pageable_host=True
        )
        key = "host-test"
    else:
        base = rrmm.mr.SimulatedMemoryResource("1GiB")
        key = None
    # Host memory: the expandable pool itself (it maps exactly what is live: nothing cached);
    # a simulated device: a pool over it (its chunks cache what is freed).
    pool = base if kind == "host" else rrmm.mr.PoolMemoryResource(base, initial_pool_size=0)
    rrmm.shared_gpu.join(
        pool,
        directory=directory,
        device_key=key,
        name=f"peer-{kind}",
        soft_share=None if soft == "none" else int(soft) * MIB,
    )
    live: list[rrmm.DeviceBuffer] = []
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        out: object
        if cmd == "fill":
            n = int(args[0])
            b = rrmm.DeviceBuffer(size=n * MIB, mr=pool)
            if kind == "host":
                b.copy_from_host(bytes(range(256)) * (n * MIB // 256))
            live.append(b)
            out = n
        elif cmd == "cache":
            n = int(args[0])
            bufs = [rrmm.DeviceBuffer(size=MIB, mr=pool) for _ in range(n)]
            del bufs
            out = pool.pool_size()
        elif cmd == "idle":
            rrmm.shared_gpu.declare_idle(pool)
            out = True
        elif cmd == "busy":
            out = rrmm.shared_gpu.declare_busy(pool)
        elif cmd == "check":
            out = all(
                b.tobytes() == bytes(range(256)) * (b.size // 256) for b in live
            ) if kind == "host" else True
        elif cmd == "asleep":
            out = base.asleep if kind == "host" else False
        elif cmd == "figures":
            me = [r for r in rrmm.shared_gpu.processes(pool) if r.name == f"peer-{kind}"]
            out = {"live": me[0].live, "cached": me[0].cached} if me else None
        elif cmd == "ask":
            out = rrmm.shared_gpu.ask(int(args[0]) * MIB, pool)
        elif cmd == "history":
            out = rrmm.shared_gpu.history(pool)
        elif cmd == "exit":
            break
        else:
            out = {"error": f"unknown command {cmd}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
