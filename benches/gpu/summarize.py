"""Summary tables of a GPU run: rrmm vs RMM side by side, with ratios (RMM time / rrmm time)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*r) for r in rows])


def cell(v: float | None) -> str:
    """A figure, or "not run" where that side produced none (never a 0 that looks measured)."""
    return "not run" if v is None else f"{v:.0f}"


def ratio(rmm: float | None, rrmm: float | None) -> str:
    if not rmm or not rrmm:
        return "-"
    return f"{rmm / rrmm:.1f}x"


def w1(out: Path) -> str:
    rows = {}
    for r in jsonl(out / "w1_rmm.jsonl") + jsonl(out / "w1_rrmm.jsonl"):
        rows.setdefault((r["trace"], r["resource"]), {})[r["impl"]] = r["ns_per_event"]
    body = [
        (t, res, cell(v.get("rrmm")), cell(v.get("rmm")), ratio(v.get("rmm"), v.get("rrmm")))
        for (t, res), v in sorted(rows.items())
    ]
    return "W1 trace replay, ns/event (ratio = RMM/rrmm, higher is better)\n" + table(
        body, ("trace", "resource", "rrmm", "RMM", "speedup")
    )


def keyed(out: Path, name: str, key: tuple, value: str) -> str:
    path = out / f"{name}.json"
    if not path.exists():
        return f"{name}: no results"
    rows: dict = {}
    for r in json.loads(path.read_text()):
        rows.setdefault(tuple(r[k] for k in key), {})[r["impl"]] = r[value]
    body = [
        (*k, cell(v.get("rrmm")), cell(v.get("rmm")), ratio(v.get("rmm"), v.get("rrmm")))
        for k, v in rows.items()
    ]
    return f"{name.upper()} ns (ratio = RMM/rrmm)\n" + table(body, (*key, "rrmm", "RMM", "speedup"))


def w2base(out: Path) -> str:
    """W2 pool before/after this change: medians over the alternating runs of each wheel."""
    import statistics

    def rrmm_ns(pattern: str) -> dict:
        got: dict = {}
        for path in sorted(out.glob(pattern)):
            for r in json.loads(path.read_text()):
                if r["impl"] == "rrmm":
                    got.setdefault(r["size"], []).append(r["ns"])
        return {k: statistics.median(v) for k, v in got.items()}

    before, after = rrmm_ns("w2_before_*.json"), rrmm_ns("w2_after_*.json")
    body = [
        (size, cell(before.get(size)), cell(after.get(size)),
         f"{(after[size] / before[size] - 1) * 100:+.1f}%" if size in before and size in after else "-")
        for size in sorted(set(before) | set(after))
    ]
    return "W2 pool round trip, rrmm before/after, ns (median over alternating processes)\n" + table(
        body, ("size", "before", "after", "change")
    )


def asyncw1(out: Path) -> str:
    """cuda_async W1 from alternating processes: RMM's harness against rrmm's replay engine
    (native, and through Python's rrmm._rrmm.replay_logs as `rrmm replay` runs it), with the bare
    loops over rrmm's resource and over the driver beside them; each cell is the median (range)
    of the rounds' medians."""
    import statistics

    got: dict = {}
    for r in jsonl(out / "asyncw1_rmm.jsonl"):
        key = "rmm" + (f" {r['stream']}" if r.get("stream") else "")
        got.setdefault(r["trace"], {}).setdefault(key, []).append(r["ns_per_event"])
    for r in jsonl(out / "asyncw1_split.jsonl"):
        got.setdefault(r["trace"], {}).setdefault(r["variant"], []).append(r["ns_per_event"])
    for r in jsonl(out / "asyncw1_python.jsonl"):
        got.setdefault(r["trace"], {}).setdefault("python", []).append(r["ns_per_event"])

    def med(v: list[float] | None) -> float | None:
        return statistics.median(v) if v else None

    def spread(v: list[float] | None) -> str:
        return "not run" if not v else f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"

    body = [
        (
            t,
            spread(v.get("engine")),
            spread(v.get("python")),
            spread(v.get("rmm")),
            ratio(med(v.get("rmm")), med(v.get("engine"))),
            ratio(med(v.get("rmm")), med(v.get("python"))),
            spread(v.get("resource")),
            spread(v.get("driver")),
        )
        for t, v in sorted(got.items())
    ]
    streams = [
        (t, spread(v.get("rmm")), spread(v.get("rmm legacy")), spread(v.get("rmm ptds")),
         spread(v.get("driver")), spread(v.get("driver ptds")), spread(v.get("driver stream")))
        for t, v in sorted(got.items())
    ]
    return "cuda_async W1, ns/event, median (range) of alternating rounds; speedup = RMM/rrmm\n" + table(
        body, ("trace", "rrmm engine", "rrmm replay_logs", "RMM", "speedup", "speedup (replay_logs)",
               "rrmm bare loop", "driver only")
    ) + "\nthe same by stream: RMM on stream 0 / cudaStreamLegacy / cudaStreamPerThread; the driver " \
        "loop on the legacy default stream / the per-thread default stream / a stream of its own\n" \
        + table(streams, ("trace", "RMM 0", "RMM legacy", "RMM ptds", "driver legacy",
                          "driver ptds", "driver stream"))


def main() -> None:
    what, out = sys.argv[1], Path(sys.argv[2])
    if what == "w1":
        print(w1(out))
    elif what == "w2":
        print(keyed(out, "w2", ("resource", "size"), "ns"))
    elif what == "w2base":
        print(w2base(out))
    elif what == "asyncw1":
        print(asyncw1(out))
    elif what == "w3":
        print(keyed(out, "w3", ("trace", "resource"), "ns_per_event"))


if __name__ == "__main__":
    main()
