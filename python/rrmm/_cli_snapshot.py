"""``rrmm snapshot view FILE``: a memory snapshot, or a logging adaptor's log, as one
self-contained HTML page (timeline, segments, blocks and holes)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``snapshot`` command to the ``rrmm`` command line."""
    parser = subparsers.add_parser(
        "snapshot",
        help="view a memory snapshot or a log as an HTML page",
        description="Memory snapshots: rrmm.memory_snapshot() or "
        "torch.cuda.memory._snapshot() saved with pickle (or JSON), or a logging adaptor's CSV "
        "log (replayed through a pool on simulated memory).",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    view = actions.add_parser(
        "view",
        help="write a self-contained HTML page (no network, no PyTorch)",
        description="Writes one HTML page with the active-memory timeline of the snapshot's "
        "history and its segments with their blocks and holes.",
    )
    view.add_argument("file", help="snapshot (.pickle, .pkl, .json) or log (.csv, .csv.gz)")
    view.add_argument("-o", "--output", help="the page to write (default: FILE.html)")
    view.add_argument("--device", type=int, default=None, help="device whose trace to show")
    view.add_argument("--title", default=None, help="the page's title")
    view.set_defaults(run=run_view)
    return parser


def run_view(args: argparse.Namespace) -> int:
    """Writes the page; returns 0, or 1 with a one-line message for a file it cannot read."""
    from rrmm._snapshot_view import load_snapshot, write_html

    try:
        snapshot = load_snapshot(args.file)
    except (OSError, ValueError, MemoryError) as error:
        print(f"rrmm snapshot view: {error}", file=sys.stderr)
        return 1
    if args.device is not None and args.device < 0:
        print("rrmm snapshot view: --device must not be negative", file=sys.stderr)
        return 2
    output = args.output or os.path.splitext(args.file.removesuffix(".gz"))[0] + ".html"
    title = args.title or f"rrmm memory snapshot: {os.path.basename(args.file)}"
    try:
        write_html(snapshot, output, title, args.device)
    except OSError as error:
        print(f"rrmm snapshot view: {error}", file=sys.stderr)
        return 1
    print(f"wrote {output}")
    return 0
