"""Command line: ``python -m rrmm info``, ``replay`` and ``snapshot view`` (also the ``rrmm``
command)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rrmm`` command line; returns the exit status."""
    from rrmm import __version__
    from rrmm._cli_common import EXIT_CODES, one_line_parser_errors

    parser = argparse.ArgumentParser(
        prog="rrmm",
        description="rrmm: CUDA memory resources. Commands: info (driver, devices, resources), "
        "replay (replay allocation logs against resources, on a GPU or simulated memory), "
        "snapshot view (a memory snapshot or a log as an HTML page).",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"rrmm {__version__}")
    one_line_parser_errors(parser, "rrmm")
    sub = parser.add_subparsers(dest="command", required=True)

    from rrmm import _cli_info, _cli_replay, _cli_snapshot

    _cli_info.add_parser(sub)
    _cli_replay.add_parser(sub)
    _cli_snapshot.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
