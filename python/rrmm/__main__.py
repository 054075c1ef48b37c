"""Command line: ``python -m rrmm info``, ``replay`` and ``snapshot view`` (also the ``rrmm``
command)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rrmm`` command line; returns the exit status."""
    from rrmm import __version__

    parser = argparse.ArgumentParser(prog="rrmm", description="rrmm: CUDA memory resources")
    parser.add_argument("--version", action="version", version=f"rrmm {__version__}")

    def one_line_error(message: str) -> NoReturn:
        print(f"rrmm: error: {message} (rrmm --help lists the commands)", file=sys.stderr)
        sys.exit(2)

    parser.error = one_line_error  # type: ignore[method-assign]
    sub = parser.add_subparsers(dest="command", required=True)

    from rrmm import _cli_info, _cli_replay, _cli_snapshot

    _cli_info.add_parser(sub)
    _cli_replay.add_parser(sub)
    _cli_snapshot.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
