"""W7 table of a GPU run: rrmm (benches/w7.rs) beside RMM (benches/gpu/rmm_w7.cu), with ratios.

Usage: python3 w7_summary.py OUT_DIR   (reads OUT_DIR/w7_rrmm.jsonl and OUT_DIR/w7_rmm.jsonl)
"""

from __future__ import annotations

import sys
from pathlib import Path

from summarize import jsonl, table


def fmt(value: float | None, spec: str) -> str:
    return "not run" if value is None else format(value, spec)


def ratio(num: float | None, den: float | None) -> str:
    return "-" if not num or not den else f"{num / den:.2f}x"


def threads_table(rrmm: list[dict], rmm: list[dict]) -> str:
    def key(r: dict) -> tuple[str, int]:
        return (r["resource"], r["threads"])

    ours = {key(r): r["mops_per_s"] for r in rrmm if r["bench"] == "threads"}
    theirs = {key(r): r["mops_per_s"] for r in rmm if r["bench"] == "threads"}
    rows = []
    for res, t in sorted(set(ours) | set(theirs)):
        mine, one = ours.get((res, t)), ours.get((res, 1))
        rows.append(
            (
                res,
                t,
                fmt(mine, ".3f"),
                fmt(theirs.get((res, t)), ".3f"),
                ratio(mine, theirs.get((res, t))),
                ratio(mine, one),
            )
        )
    return (
        "W7 threads: total Mops/s (each thread on its own stream; ratio = rrmm/RMM, "
        "scaling = rrmm vs its 1 thread; higher is better)\n"
        + table(rows, ("resource", "threads", "rrmm", "RMM", "rrmm/RMM", "scaling"))
    )


def streams_table(rrmm: list[dict], rmm: list[dict]) -> str:
    ours = {
        (r["resource"], r["streams"], r.get("mode", "warm")): r["median_us"]
        for r in rrmm
        if r["bench"] == "multi_stream"
    }
    theirs = {
        (r["resource"], r["streams"]): r["median_us"] for r in rmm if r["bench"] == "multi_stream"
    }
    keys = set(ours) | {(res, s, "warm") for res, s in theirs}
    rows = []
    for res, s, mode in sorted(keys):
        mine = ours.get((res, s, mode))
        one = ours.get((res, 1, mode))
        ideal = one / s if one else None  # a quarter of one stream's time at 4 streams
        rmm_us = theirs.get((res, s)) if mode == "warm" else None
        rows.append(
            (
                res,
                mode,
                s,
                fmt(mine, ".1f"),
                fmt(rmm_us, ".1f"),
                ratio(rmm_us, mine),
                ratio(mine, ideal),
            )
        )
    return (
        "W7 multi-stream: 4 kernels spinning ~1M clocks, us (ratio = RMM/rrmm, higher is "
        "better; vs ideal = time / (1-stream time / streams), 1.00x is perfect overlap)\n"
        + table(rows, ("resource", "mode", "streams", "rrmm", "RMM", "RMM/rrmm", "vs ideal"))
    )


def main() -> None:
    out = Path(sys.argv[1])
    rrmm, rmm = jsonl(out / "w7_rrmm.jsonl"), jsonl(out / "w7_rmm.jsonl")
    if not rrmm and not rmm:
        print("W7: no results")
        return
    print(threads_table(rrmm, rmm))
    print()
    print(streams_table(rrmm, rmm))


if __name__ == "__main__":
    main()
