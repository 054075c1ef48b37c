"""``rrmm replay``: replay RMM-format allocation logs against memory resources.

Replays one or more logs written by RMM's or rrmm's ``LoggingResourceAdaptor`` (CSV, plain or
gzipped) against one resource (``--resource``) or several (``--compare``), on the GPU or on
simulated memory of any size (``--simulate``), and reports time per event, peak memory, the
resource's footprint (pool size), fragmentation, failed allocations and leaks; ``--json`` for
scripts, ``--plot`` for a picture.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

#: Simulated memory used when there is no GPU and no ``--simulate``: an 80 GiB device.
DEFAULT_SIMULATED_BYTES = 80 << 30

#: Points of the timeline recorded per replay for ``--plot``.
PLOT_POINTS = 2000

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 10**3,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size such as ``4GiB``, ``512 MiB``, ``1.5GB``, ``4G`` or ``1000000`` into bytes.

    Binary units (KiB, MiB, GiB, TiB, and the bare K, M, G, T) are powers of 1024; decimal
    units (KB, MB, GB, TB) are powers of 1000.
    """
    match = _SIZE.match(str(text))
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4GiB, 512MiB, 1000000)")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise argparse.ArgumentTypeError(
            f"unknown unit {unit!r} in {text!r} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    value = float(number) * factor
    if not math.isfinite(value) or value < 0 or value >= 2**64:
        raise argparse.ArgumentTypeError(f"size out of range: {text!r}")
    return int(value)


def format_bytes(value: int | None) -> str:
    """Human-readable bytes (binary units), ``-`` for None."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{value} B"  # pragma: no cover


def _format_fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _resolve_log(log: str) -> str:
    """A path as given, or the file of a shipped trace when ``log`` names one and no such file
    exists."""
    if os.path.exists(log):
        return log
    from rrmm import traces

    try:
        return str(traces.path(log))
    except KeyError:
        return log  # the engine reports the missing file by name


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` command to ``subparsers``; sets ``run`` to :func:`run`."""
    parser = subparsers.add_parser(
        "replay",
        help="replay RMM-format allocation logs against memory resources",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "logs",
        metavar="LOG",
        nargs="+",
        help="RMM-format CSV log (plain or .gz), or the name of a log shipped with rrmm "
        "(transformer_training, random_10k_1mib)",
    )
    parser.add_argument(
        "--resource",
        default="pool",
        help="resource to replay against: pool, binning, arena, fixed_size, cuda, cuda_async, managed "
        "(default: pool)",
    )
    parser.add_argument(
        "--compare",
        metavar="R1,R2,...",
        help="replay against each of these resources and print one table ('all': every one)",
    )
    parser.add_argument(
        "--simulate",
        metavar="SIZE",
        type=parse_size,
        help="replay on simulated device memory of SIZE bytes (e.g. 80GiB) instead of the GPU "
        "(default without a GPU: 80GiB)",
    )
    parser.add_argument("--initial-pool-size", metavar="SIZE", type=parse_size)
    parser.add_argument("--maximum-pool-size", metavar="SIZE", type=parse_size)
    parser.add_argument(
        "--arena-size", metavar="SIZE", type=parse_size,
        help="size of the arena resource (default: half the free memory)",
    )
    parser.add_argument("--plot", metavar="OUT.png", help="draw memory over the events to a PNG")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="skip bad lines of a log with a counted warning instead of stopping",
    )
    parser.set_defaults(run=run)
    return parser


def _resources(args: argparse.Namespace, gpu: bool, known: Sequence[str]) -> list[str]:
    if args.compare:
        names = [n.strip() for n in args.compare.split(",") if n.strip()]
        if names == ["all"]:
            if gpu:
                return [n for n in known if n != "simulated"]
            return ["pool", "binning", "arena", "fixed_size", "simulated"]
    else:
        names = [args.resource.strip()]
    out: list[str] = []
    for name in names:
        canonical = name.lower().replace("-", "_")
        if canonical not in known:
            raise ValueError(f"unknown resource {name!r}; known: {', '.join(known)}")
        if canonical not in out:
            out.append(canonical)
    if not out:
        raise ValueError("--compare names no resource")
    return out


def _table(reports: list[dict[str, Any]]) -> str:
    header = [
        "resource",
        "events",
        "ns/event",
        "peak in use",
        "peak footprint",
        "frag@peak",
        "frag@end",
        "failed",
        "leaks",
    ]
    rows = []
    for r in reports:
        failed = str(r["failed_allocations"])
        if r["failed_allocations"]:
            failed += " !"
        leaks = "0" if not r["leaked_allocations"] else (
            f"{r['leaked_allocations']} ({format_bytes(r['leaked_bytes'])})"
        )
        rows.append(
            [
                r["resource"],
                str(r["events"]),
                f"{r['ns_per_event']:.1f}",
                format_bytes(r["peak_bytes_in_use"]),
                format_bytes(r["peak_footprint"]),
                _format_fraction(r["fragmentation_at_peak"]),
                _format_fraction(r["fragmentation_at_end"]),
                failed,
                leaks,
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        # The resource column is left-aligned, the figures right-aligned.
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    lines = [line(header), "  ".join("-" * w for w in widths)]
    lines.extend(line(row) for row in rows)
    return "\n".join(lines)


def _print_text(reports: list[dict[str, Any]], target: str, out: Any) -> None:
    logs: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        logs.setdefault(r["log"], []).append(r)
    for log, rs in logs.items():
        first = rs[0]
        print(f"{log}: {first['events']} events, {first['threads']} thread(s), "
              f"{first['streams']} stream(s), peak {format_bytes(first['log_peak_bytes'])} "
              f"in use in the log; on {target}", file=out)
        if first["logged_failures"]:
            print(f"  the log records {first['logged_failures']} failed allocation(s) "
                  "(not replayed)", file=out)
        if first["parse_warnings"]:
            print(f"  {first['parse_warnings']} bad line(s) skipped (--lenient):", file=out)
            for message in first["warning_messages"]:
                print(f"    {message}", file=out)
        print(_table(rs), file=out)
        for r in rs:
            if r["failed_allocations"]:
                shown = ", ".join(str(i) for i in r["failure_events"][:10])
                more = " ..." if r["failed_allocations"] > 10 else ""
                print(f"  {r['resource']}: {r['failed_allocations']} allocation(s) failed "
                      f"({format_bytes(r['failed_bytes'])}), at events {shown}{more}", file=out)
        print(file=out)


def _json_report(r: dict[str, Any], with_timeline: bool) -> dict[str, Any]:
    out = dict(r)
    if not with_timeline:
        out.pop("timeline", None)
    return out


def plot(reports: list[dict[str, Any]], path: str) -> None:
    """Draw bytes in use and footprint over the events, one subplot per log, one line per
    resource, failures marked with red crosses, to the PNG ``path``.

    Raises ImportError with an installation hint when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "--plot needs matplotlib: pip install rrmm[plot] (or pip install matplotlib)"
        ) from e

    logs: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        logs.setdefault(r["log"], []).append(r)
    fig, axes = plt.subplots(len(logs), 1, figsize=(10, 4.5 * len(logs)), squeeze=False)
    gib = float(1 << 30)
    for ax, (log, rs) in zip(axes[:, 0], logs.items()):
        first_in_use = rs[0]["timeline"]["bytes_in_use"]
        distinct = any(r["timeline"]["bytes_in_use"] != first_in_use for r in rs)
        for index, r in enumerate(rs):
            t = r["timeline"]
            events, in_use = t["event"], t["bytes_in_use"]
            # Bytes in use are the same for every resource unless allocations failed.
            if index == 0 or in_use != first_in_use:
                label = f"{r['resource']}: bytes in use" if distinct else "bytes in use"
                ax.plot(events, [b / gib for b in in_use], linewidth=1.2, label=label)
            points = [(e, f) for e, f in zip(events, t["footprint"]) if f is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] / gib for p in points], linestyle="--",
                        linewidth=1.2, label=f"{r['resource']}: footprint")
            if r["failure_events"] and events:
                ys = []
                for failed_at in r["failure_events"]:
                    # The bytes in use at the nearest recorded point before the failure.
                    lo, hi = 0, len(events) - 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if events[mid] <= failed_at:
                            lo = mid
                        else:
                            hi = mid - 1
                    ys.append(in_use[lo] / gib)
                ax.scatter(r["failure_events"], ys, marker="x", color="red", s=18, zorder=5,
                           label=f"{r['resource']}: failed allocations ({r['failed_allocations']})")
        ax.set_title(os.path.basename(log))
        ax.set_xlabel("event")
        ax.set_ylabel("GiB")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run ``rrmm replay`` with parsed arguments; returns the exit status (0 ok, 1 plotting
    impossible, 2 bad input or arguments)."""
    from rrmm import _rrmm

    def fail(message: str) -> int:
        print(f"rrmm replay: error: {message}", file=sys.stderr)
        return 2

    known = list(_rrmm.replay_resource_names())
    simulate = args.simulate
    gpu = simulate is None and bool(_rrmm.replay_gpu_available())
    if simulate is None and not gpu:
        simulate = DEFAULT_SIMULATED_BYTES
        print(f"rrmm replay: no GPU found; replaying on simulated memory of "
              f"{format_bytes(simulate)} (--simulate SIZE to choose)", file=sys.stderr)
    if simulate is not None and simulate <= 0:
        return fail("--simulate needs a positive size")
    try:
        resources = _resources(args, gpu, known)
    except ValueError as e:
        return fail(str(e))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("rrmm replay: --plot needs matplotlib: pip install rrmm[plot] "
                  "(or pip install matplotlib)", file=sys.stderr)
            return 1
    progress = not args.json and sys.stderr.isatty()
    try:
        reports = _rrmm.replay_logs(
            [_resolve_log(log) for log in args.logs],
            resources,
            simulate=simulate,
            initial_pool_size=args.initial_pool_size,
            maximum_pool_size=args.maximum_pool_size,
            lenient=args.lenient,
            timeline_points=PLOT_POINTS if args.plot else 0,
            progress=progress,
            arena_size=args.arena_size,
        )
    except (ValueError, OSError) as e:
        return fail(str(e))
    except MemoryError as e:
        return fail(f"out of memory building the resource: {e}")
    except RuntimeError as e:
        return fail(str(e))
    target = f"simulated memory of {format_bytes(simulate)}" if simulate is not None else "the GPU"
    if args.json:
        doc = {
            "memory": "simulated" if simulate is not None else "gpu",
            "simulated_bytes": simulate,
            "reports": [_json_report(r, with_timeline=bool(args.plot)) for r in reports],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(reports, target, sys.stdout)
    if args.plot:
        plot(reports, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0
