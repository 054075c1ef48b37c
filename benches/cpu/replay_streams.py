"""Replay time against the number of distinct streams (issue 21): the same number of events
spread over 1, 1k, 10k and 100k streams, each resource on simulated memory, wall time of one
`rrmm replay` pass per cell. The cost must stay flat in streams (linear in events).

    python3 benches/cpu/replay_streams.py [--events 200000] [--resources pool,arena,...]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (256 << 10, 1 << 20, 2 << 20, 64 << 10)


def write_log(path: Path, events: int, streams: int, seed: int = 7) -> None:
    """Each stream allocates a few blocks and frees them on the same stream, streams in turn."""
    rng = random.Random(seed)
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    addr = 0x7F0000000000
    per_stream = max(2, events // streams)
    done = 0
    s = 0
    while done < events:
        sid = 0x1000 + (s % streams) * 16
        live = []
        for _ in range(per_stream // 2):
            size = rng.choice(SIZES)
            rows.append(f"1,t,allocate,{addr:#x},{size},{sid:#x}")
            live.append((addr, size))
            addr += size
        for a, size in live:
            rows.append(f"1,t,free,{a:#x},{size},{sid:#x}")
        done += 2 * len(live)
        s += 1
    path.write_text("\n".join(rows) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--streams", default="1,1000,10000,100000")
    ap.add_argument("--resources", default="pool,expandable,arena,binning,managed_pool")
    args = ap.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    resources = args.resources.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        logs = {}
        for n in counts:
            logs[n] = Path(tmp) / f"streams_{n}.csv"
            write_log(logs[n], args.events, n)
        print(f"rrmm replay wall time (s), {args.events} events, simulated 64 GiB, one pass")
        print(f"{'resource':14s}" + "".join(f"{n:>10d}" for n in counts))
        for r in resources:
            cells = []
            for n in counts:
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "rrmm", "replay", str(logs[n]),
                                       "--simulate", "64GiB", "--resource", r, "--repeat", "1"],
                                      capture_output=True, text=True, check=False)
                took = time.perf_counter() - t0
                cells.append(f"{took:10.2f}" if proc.returncode == 0 else f"{'fail':>10s}")
            print(f"{r:14s}" + "".join(cells))


if __name__ == "__main__":
    main()
