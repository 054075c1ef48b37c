"""What every ``rrmm`` subcommand shares: its exit codes, its one-line errors and the names of
the shipped logs."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

__all__ = ["EXIT_CODES", "USAGE", "fail", "one_line", "one_line_parser_errors", "resolve_log"]

#: A misuse: bad arguments, or an input file that is missing or not what the command reads.
USAGE = 2

EXIT_CODES = """\
Exit status (every rrmm command): 0 done; 1 the work could not be finished for a reason
outside the input (a page or plot that cannot be written, matplotlib missing); 2 a usage
error: bad arguments, or an input that is missing or not what the command reads; 3 rrmm replay
--check found a failed allocation. Errors are one line on standard error, never a traceback."""


def one_line(message: str) -> str:
    """``message`` on one line (a multi-line error keeps its first line)."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    return lines[0] if lines else "error"


def fail(name: str, message: str, code: int = USAGE) -> int:
    """Prints ``NAME: error: MESSAGE`` on one line to standard error; returns ``code``."""
    print(f"{name}: error: {one_line(message)}", file=sys.stderr)
    return code


def one_line_parser_errors(parser: argparse.ArgumentParser, name: str) -> None:
    """Makes ``parser``'s usage errors one line (argparse prints its usage block first) with
    exit status 2, naming the ``--help`` that lists the options."""

    def error(message: str) -> NoReturn:
        print(f"{name}: error: {one_line(message)} ({name} --help lists the options)",
              file=sys.stderr)
        sys.exit(USAGE)

    parser.error = error  # type: ignore[method-assign]


def resolve_log(log: str) -> tuple[str, str]:
    """(file to read, name to show): a path as given, or the file of a shipped trace when ``log``
    names one and no such file exists (shown by its file name, not its installed path)."""
    if os.path.exists(log):
        return log, log
    from rrmm import traces

    try:
        path = traces.path(log)
    except KeyError:
        return log, log  # the command reports the missing file by name
    return str(path), path.name
