"""Command line: ``python -m rrmm info``, ``replay`` and ``snapshot view`` (also the ``rrmm``
command)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The ``rrmm`` parser with every subcommand; each sets ``run`` to the function that runs
    it."""
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rrmm`` command line; returns the exit status. Every subcommand's output goes
    through one policy (``rrmm._cli_common.run_with_output``): closed, broken and full streams
    end as ``--help``'s exit status section says, never with a traceback."""
    from rrmm._cli_common import fail, parse_command_line, run_with_output

    def command() -> int:
        args = parse_command_line(build_parser(), argv)
        progress = os.environ.get("RRMM_PROGRESS", "").strip()
        if progress not in ("", "0", "1"):
            return fail(f"rrmm {args.command}", f"RRMM_PROGRESS={progress!r} in the "
                        "environment is neither 0 (no progress bar) nor 1 (a bar on standard "
                        "error); unset it for a bar on a terminal only")
        return int(args.run(args) or 0)

    return run_with_output(command)


if __name__ == "__main__":
    sys.exit(main())
