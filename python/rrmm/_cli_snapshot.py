"""``rrmm snapshot view FILE``: a memory snapshot, or a logging adaptor's log, as one
self-contained HTML page (timeline, segments, blocks and holes)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rrmm._cli_common import (
    EXIT_CODES,
    RECORDING,
    error_text,
    fail,
    missing_log,
    one_line_parser_errors,
    resolve_log,
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``snapshot`` command to the ``rrmm`` command line."""
    parser = subparsers.add_parser(
        "snapshot",
        help="view a memory snapshot or a log as an HTML page",
        description="Memory snapshots: rrmm.memory_snapshot() or "
        "torch.cuda.memory._snapshot() saved with pickle (or JSON), or a logging adaptor's CSV "
        "log (replayed through a pool on simulated memory).",
        epilog=EXIT_CODES,
    )
    one_line_parser_errors(parser, "rrmm snapshot")
    actions = parser.add_subparsers(dest="action", required=True)
    view = actions.add_parser(
        "view",
        help="write a self-contained HTML page (no network, no PyTorch)",
        description="Writes one HTML page with the active-memory timeline of the snapshot's "
        "history and its segments with their blocks and holes. FILE is a snapshot "
        "(rrmm.memory_snapshot() or torch.cuda.memory._snapshot() saved with pickle or as "
        "JSON), a logging adaptor's CSV log (plain or .gz, replayed through a pool on "
        "simulated memory; its events are counted as rrmm replay counts them), or the name "
        "of a log shipped with rrmm (transformer_training, random_10k_1mib, random_100k_4mib). "
        "Example: rrmm snapshot view transformer_training -o transformer.html",
        epilog=f"{RECORDING}\n\n{EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one_line_parser_errors(view, "rrmm snapshot view")
    view.add_argument("file", metavar="FILE",
                      help="snapshot (.pickle, .pkl, .json), log (.csv, .csv.gz) or shipped log")
    view.add_argument("-o", "--output", metavar="PAGE.html",
                      help="the page to write, a path (default: FILE's name with .html beside "
                      "FILE, or in the current directory for a shipped log's name; never FILE); "
                      "the command prints where it wrote it")
    view.add_argument("--device", type=int, default=None,
                      help="device whose trace to show (default: the first with a trace); a "
                      "device the snapshot has nothing of is a usage error")
    view.add_argument("--title", default=None, help="the page's title")
    view.add_argument("-q", "--quiet", action="store_true",
                      help="no progress bar while a log replays (drawn only on a terminal)")
    view.set_defaults(run=run_view)
    return parser


def _default_output(path: str, shown: str) -> str:
    """FILE's name with ``.html`` in the current directory for a shipped log, beside FILE
    otherwise; ``NAME.view.html`` where that would be FILE itself."""
    base = os.path.basename(shown) if shown != path else path
    stem = base.removesuffix(".gz")
    output = os.path.splitext(stem)[0] + ".html"
    if os.path.exists(output) and os.path.exists(path) and os.path.samefile(output, path):
        output = os.path.splitext(stem)[0] + ".view.html"
    return output


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def run_view(args: argparse.Namespace) -> int:
    """Writes the page; returns 0, 2 with a one-line message for bad arguments or a file that
    is missing or not a snapshot or log (as ``rrmm replay``), 1 when the page cannot be
    written."""
    from rrmm._snapshot_view import load_snapshot, write_html

    name = "rrmm snapshot view"
    if args.device is not None and args.device < 0:
        return fail(name, "--device must not be negative")
    path, shown = resolve_log(args.file)
    output = args.output or _default_output(path, shown)
    if _same_file(output, path):
        return fail(name, f"the page {output!r} would write over its input; choose another "
                    "with -o")
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        return fail(name, f"-o {output!r}: directory {directory!r} does not exist")
    if os.path.isdir(output):
        return fail(name, f"-o {output!r} is a directory")
    try:
        snapshot = load_snapshot(path, quiet=args.quiet)
    except FileNotFoundError:
        return fail(name, missing_log(args.file))
    except MemoryError:
        return fail(name, f"{args.file}: too large to read into memory")
    except (OSError, ValueError, RecursionError) as error:
        return fail(name, error_text(error))
    title = args.title or f"rrmm memory snapshot: {os.path.basename(shown)}"
    try:
        write_html(snapshot, output, title, args.device)
    except OSError as error:
        return fail(name, f"cannot write {output!r}: {error.strerror or error}", code=1)
    except ValueError as error:
        return fail(name, error_text(error))
    print(f"wrote {os.path.abspath(output)}")
    return 0
