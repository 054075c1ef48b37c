"""What every ``rrmm`` subcommand shares: its exit codes, its one-line errors, the names of
the shipped logs, and the one place its output is written through (:func:`run_with_output`)."""

from __future__ import annotations

import argparse
import difflib
import io
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import IO, NoReturn

__all__ = [
    "EXIT_CODES", "OUTPUT_FAILED", "RECORDING", "USAGE", "OutputError", "error_text", "fail",
    "missing_log", "one_line", "one_line_parser_errors", "parse_command_line", "resolve_log",
    "run_with_output",
]

#: A misuse: bad arguments, or an input file that is missing or not what the command reads.
USAGE = 2

#: The work could not be finished for a reason outside the input; also standard output that
#: cannot be written (closed, a full disk, an I/O error).
OUTPUT_FAILED = 1

EXIT_CODES = """\
Exit status (every rrmm command): 0 done; 1 the work could not be finished for a reason
outside the input (a page or plot that cannot be written, matplotlib missing, standard output
closed or not writable, such as a full disk); 2 a usage error: bad arguments, or an input that
is missing or not what the command reads; 3 rrmm replay --check found a failed allocation.
Errors are one line on standard error, never a traceback. A reader that stops early (rrmm ...
| head) ends the output quietly, as Unix tools do, and the status is the command's own; with
standard error closed or full, progress and messages are skipped and the work goes on."""


def one_line(message: str) -> str:
    """``message`` on one line (a multi-line error keeps its first line)."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    return lines[0] if lines else "failed without a message"


#: What an exception without a message of its own means, by type.
_SILENT_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (MemoryError, "out of memory"),
    (RecursionError, "nested too deeply"),
)


def error_text(error: BaseException) -> str:
    """The first line of ``error``'s message; for an exception that carries none (a
    MemoryError), what its type means, never an empty or bare word."""
    text = str(error).strip()
    if text:
        return one_line(text)
    for kind, meaning in _SILENT_ERRORS:
        if isinstance(error, kind):
            return meaning
    return f"{type(error).__name__} without a message"


def fail(name: str, message: str, code: int = USAGE) -> int:
    """Prints ``NAME: error: MESSAGE`` on one line to standard error; returns ``code``."""
    print(f"{name}: error: {one_line(message)}", file=sys.stderr)
    return code


def one_line_parser_errors(parser: argparse.ArgumentParser, name: str) -> None:
    """Makes ``parser``'s usage errors one line (argparse prints its usage block first) with
    exit status 2, naming the ``--help`` that lists the options, and the close name for a
    misspelt command (``did you mean 'replay'?``)."""

    def error(message: str) -> NoReturn:
        print(f"{name}: error: {one_line(message)}{_choice_hint(message)} ({name} --help lists "
              "the options)", file=sys.stderr)
        sys.exit(USAGE)

    parser.error = error  # type: ignore[method-assign]


#: argparse's words for a command that is none of the choices (Python 3.11 to 3.13).
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _choice_hint(message: str) -> str:
    """`` (did you mean 'replay'?)`` for argparse's refusal of a misspelt choice; empty
    otherwise."""
    found = _INVALID_CHOICE.search(message)
    if found is None or "did you mean" in message:
        return ""
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    close = difflib.get_close_matches(found.group(1), choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_command_line(parser: argparse.ArgumentParser,
                       argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with an argument that no parser knows blamed on the
    subcommand that was given it (``rrmm replay: error: unrecognized arguments: --simlate (did
    you mean --simulate?)``), not on ``rrmm``: argparse leaves a subcommand's unknown arguments
    to the top parser, whose usage names no option of the subcommand."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        chosen = _chosen_parser(parser, args)
        known = [o for action in chosen._actions for o in action.option_strings]
        hints = []
        for extra in extras:
            if extra.startswith("-"):
                close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1)
                if close:
                    hints.append(f"{extra}: did you mean {close[0]}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        chosen.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args


def _chosen_parser(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest subcommand's parser that ``args`` chose (``rrmm snapshot view``'s)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _chosen_parser(chosen, args)
    return parser


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


#: How a log of one's own is recorded and what the file is called, for ``--help`` texts.
RECORDING = """Recording a log of your own: rrmm.reinitialize(logging=True, log_file_name="mylog.csv") (or
rrmm.mr.LoggingResourceAdaptor(upstream, "mylog.csv") over any resource, or RMM's own adaptor)
logs every allocation and free; as RMM's, the adaptor inserts the device before the extension,
so device 0 writes mylog.dev0.csv: replay that file (rrmm replay mylog.dev0.csv)."""


def missing_log(log: str) -> str:
    """Why ``log`` cannot be read, in one line: no such file, nor a shipped log's name, and
    where the logging adaptor wrote its own files beside it (``mylog.dev0.csv`` for
    ``mylog.csv``: it inserts the device before the extension), the file that exists."""
    from rrmm import traces

    directory, base = os.path.split(log)
    stem, extension = os.path.splitext(base)
    if extension == ".gz":
        stem, inner = os.path.splitext(stem)
        extension = inner + extension
    try:
        candidates = sorted(
            name for name in os.listdir(directory or ".")
            if re.fullmatch(re.escape(stem) + r"\.dev[0-9]+" + re.escape(extension), name)
        )
    except OSError:
        candidates = []
    if candidates:
        found = ", ".join(os.path.join(directory, c) for c in candidates)
        return (f"{log}: no such file; the logging adaptor inserts the device before the "
                f"extension, so the log is {found}: did you mean "
                f"{os.path.join(directory, candidates[0])}?")
    return (f"{log}: no such file (nor a shipped log's name: "
            f"{', '.join(traces.names())})")


# ---------------------------------------------------------------- output


class OutputError(Exception):
    """Standard output could not be written (a full disk, a descriptor not open for writing):
    the command's report is lost, so the command fails (status 1). Not an OSError, so that a
    command's own ``except OSError`` (a log it cannot read) never takes it for its input's."""


def _discard_descriptor(stream: IO[str]) -> None:
    """Points ``stream``'s file descriptor at the null device, so the interpreter's last flush
    of what is still buffered cannot fail again (Python's advice after a BrokenPipeError); a
    stream without a descriptor (a test's StringIO) is left alone."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)


class _StreamGuard(io.TextIOBase):
    """A text stream written through to ``stream``, turning its write errors into the command
    line's behaviour (subclasses say which). Once a write has failed, later writes are dropped:
    what follows a broken pipe or a full disk would fail the same way."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.dropping = False

    def write(self, text: str) -> int:
        if not self.dropping:
            try:
                self.stream.write(text)
            except (OSError, ValueError) as error:
                self._failed(error)
        return len(text)

    def flush(self) -> None:
        if not self.dropping:
            try:
                self.stream.flush()
            except (OSError, ValueError) as error:
                self._failed(error)

    def writable(self) -> bool:
        return not self.dropping

    def isatty(self) -> bool:
        try:
            return not self.dropping and bool(self.stream.isatty())
        except (OSError, ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def close(self) -> None:
        """Stops writing; the stream written to (the interpreter's own) stays open."""
        self.dropping = True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    def _failed(self, error: OSError | ValueError) -> None:
        self.dropping = True
        _discard_descriptor(self.stream)


class _Output(_StreamGuard):
    """Standard output: a reader that went away (a broken pipe: ``| head``) ends the output
    quietly and the command goes on to its own status; any other write error (a full disk, a
    closed descriptor) raises :class:`OutputError`."""

    def _failed(self, error: OSError | ValueError) -> None:
        super()._failed(error)
        if not isinstance(error, BrokenPipeError):
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise OutputError(f"cannot write to standard output: {reason}") from None


class _Diagnostics(_StreamGuard):
    """Standard error: progress and error messages that cannot be written (the stream closed,
    broken or full) are dropped; there is nowhere left to say so, and the work goes on."""


class _Nowhere(io.TextIOBase):
    """Standard error closed when the command started: writes go nowhere; not writable, so no
    progress bar is drawn for it."""

    def write(self, text: str) -> int:
        return len(text)


def run_with_output(command: Callable[[], int], name: str = "rrmm") -> int:
    """Runs ``command`` (a whole subcommand: parsing, work and report) with standard output and
    standard error written through the command line's one output policy (:data:`EXIT_CODES`):
    standard output closed at start is a one-line error and status 1 before any work; a broken
    pipe ends the output quietly and keeps the command's status; a write error (ENOSPC) is a
    one-line error and status 1; standard error closed, broken or full is skipped. Returns the
    status; ``command``'s SystemExit (argparse's ``--help`` and usage errors) passes through
    once its output is flushed."""
    if sys.stdout is None:
        message = (f"{name}: error: standard output is closed, so nothing can be printed "
                   "(redirect it to /dev/null to discard it)")
        if sys.stderr is not None:
            _Diagnostics(sys.stderr).write(message + "\n")
        return OUTPUT_FAILED
    saved = sys.stdout, sys.stderr
    output = _Output(sys.stdout)
    sys.stdout = output
    sys.stderr = _Diagnostics(sys.stderr) if sys.stderr is not None else _Nowhere()
    try:
        try:
            status = command()
        finally:
            output.flush()
    except OutputError as error:
        return fail(name, str(error), code=OUTPUT_FAILED)
    finally:
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved
    return status
