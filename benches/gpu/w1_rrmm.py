"""W1 for rrmm: the Rust replay engine (through rrmm._rrmm.replay_logs) on the real GPU.

Same traces, resources and repetitions as benches/gpu/rmm_replay.cu; prints and writes JSON lines
({"impl": "rrmm", "trace", "resource", "events", "ns_per_event", "failures"}).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rrmm import _rrmm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="w1_rrmm.jsonl")
    ap.add_argument("--traces", default=".gpu/traces")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--resources",
        default="pool,binning,fixed_size,cuda_async,cuda",
        help="comma-separated replay resources (add 'expandable' to measure it beside the pool)",
    )
    args = ap.parse_args()
    with open(args.out, "w") as out:
        for name in ("random_10k_1mib", "random_100k_4mib", "transformer_training"):
            log = str(Path(args.traces) / f"{name}.csv.gz")
            resources = args.resources.split(",")
            if name == "random_100k_4mib" and "cuda" in resources:
                resources.remove("cuda")
            for res in resources:
                runs = [_rrmm.replay_logs([log], [res])[0] for _ in range(args.reps)]
                row = {
                    "impl": "rrmm",
                    "trace": name,
                    "resource": res,
                    "events": runs[0]["events"],
                    "ns_per_event": statistics.median(r["ns_per_event"] for r in runs),
                    "failures": runs[0]["failed_allocations"],
                    "peak_footprint": runs[0]["peak_footprint"],
                }
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
