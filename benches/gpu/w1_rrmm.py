"""W1 for rrmm: the Rust replay engine (through rrmm._rrmm.replay_logs) on the real GPU.

Same traces, resources and repetitions as benches/gpu/rmm_replay.cu; prints and writes JSON lines
({"impl": "rrmm", "trace", "resource", "events", "ns_per_event", "failures"}).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rrmm import _rrmm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="w1_rrmm.jsonl")
    ap.add_argument("--traces", default=".gpu/traces")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--resources",
        default="pool,binning,arena,expandable,fixed_size,cuda_async,cuda",
        help="comma-separated replay resources",
    )
    ap.add_argument("--only", default=None, help="one trace name (default: the three of W1)")
    args = ap.parse_args()
    with open(args.out, "w") as out:
        names = ("random_10k_1mib", "random_100k_4mib", "transformer_training")
        for name in [args.only] if args.only else names:
            log = str(Path(args.traces) / f"{name}.csv.gz")
            resources = args.resources.split(",")
            if name == "random_100k_4mib" and "cuda" in resources:
                resources.remove("cuda")
            for res in resources:
                # One resource, a warm-up pass, then `reps` timed repetitions on it (warm
                # against warm, as RMM's harness does); ns_per_event is their median.
                (run,) = _rrmm.replay_logs([log], [res], repeat=args.reps)
                row = {
                    "impl": "rrmm",
                    "trace": name,
                    "resource": res,
                    "events": run["events"],
                    "ns_per_event": run["ns_per_event"],
                    "spread": run["spread"],
                    "failures": run["failed_allocations"],
                    "peak_footprint": run["peak_footprint"],
                }
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
