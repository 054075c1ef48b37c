"""``rrmm replay``: replay RMM-format allocation logs against memory resources.

Replays one or more logs written by RMM's or rrmm's ``LoggingResourceAdaptor`` (CSV, plain or
gzipped) against one resource (``--resource``) or several (``--compare``), on the GPU or on a
simulated device of any size (``--simulate``), and reports time per event, memory held,
overhead, waste, fragmentation and failed allocations; ``--fit`` finds the smallest device each
resource needs; ``--json`` for scripts, ``--plot`` for a picture. On a GPU, ``torch`` and
``cupy`` in ``--compare`` replay the logs through PyTorch's caching allocator and CuPy's memory
pool too, through their Python APIs, beside each rrmm resource driven from Python: the same
engine over their Python functions (``rrmm._replay_peers`` holds the adapters).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Self

from rrmm import _replay_peers, parse_bytes
from rrmm._cli_common import (
    EXIT_CODES,
    RECORDING,
    USAGE,
    error_text,
    missing_log,
    one_line_parser_errors,
    resolve_log,
)
from rrmm._cli_common import fail as fail_with
from rrmm._progress import Progress, progress_wanted
from rrmm._replay_peers import PEERS, PYTHON_DRIVER
from rrmm._replay_types import FitRecord, ReplayRecord

#: Simulated memory used when there is no GPU and no ``--simulate``: an 80 GiB device.
DEFAULT_SIMULATED_BYTES = 80 << 30

#: Points of the timeline recorded per replay for ``--plot``.
PLOT_POINTS = 2000

#: The largest simulated device, peer GPU or host memory (``rrmm::resource::MAX_SIMULATED_SIZE``,
#: 32 PiB: byte counters over it never overflow); a size above it is refused as a usage error.
MAX_SIMULATED_BYTES = 32 << 50

#: The source resources that the simulated device stands for on simulated memory (managed memory
#: is its own row there: the device with a host tier beyond it).
SOURCE_RESOURCES = ("cuda", "cuda_async", "pinned")

#: Kinds of pinned host memory: on a GPU, left out of ``--compare all`` (each pins host memory
#: of the device's scale); named, they are replayed. On simulated memory they are in it.
HOST_RESOURCES = ("pinned", "pinned_pool", "pinned_expandable")

#: The kinds with a pool, which read --initial-pool-size and --maximum-pool-size.
POOL_RESOURCES = ("pool", "expandable", "binning", "managed_pool", "fallback", "any_size",
                  "tiered", "pinned_pool", "pinned_expandable")

#: Each resource option (its name in the parsed arguments) and the resources whose setup reads
#: it (``rrmm::stack::kinds``: each kind's plan). An option that none of the resources replayed
#: reads would change nothing: it is refused, never ignored.
OPTION_READERS: dict[str, tuple[str, ...]] = {
    "initial_pool_size": (*POOL_RESOURCES, "cuda_async"),
    "maximum_pool_size": POOL_RESOURCES,
    "bins": ("binning",),
    "block_size": ("fixed_size",),
    "blocks": ("binning", "fixed_size"),
    "arena_size": ("arena",),
    "host_memory": ("managed", "managed_pool", "fallback", "tiered"),
    "peer_memory": ("tiered",),
}

#: Resource options read on a simulated device only: on a GPU, host memory and the peer GPU are
#: the machine's own.
SIMULATED_ONLY_OPTIONS = ("host_memory", "peer_memory")

#: The kinds that read --host-memory as the room beyond the simulated device itself (the
#: device and its host memory are one simulated range: together at most 32 PiB).
MANAGED_RESOURCES = ("managed", "managed_pool")

#: How to get matplotlib for ``--plot``: rrmm is not on PyPI, so ``pip install 'rrmm[plot]'``
#: finds nothing; the ``plot`` extra installs from a checkout.
PLOT_INSTALL_HINT = ("pip install matplotlib (rrmm is not on PyPI: from a checkout of rrmm, "
                     "pip install '.[plot]' installs rrmm with it)")

#: File types ``--plot`` writes (matplotlib's raster and vector formats).
PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")

DEFINITIONS = """\
The report (one row per resource, the log's own properties once in the header):
  ns/event    median time per log event over the timed repetitions (--repeat), which run on
              the same resource after a warm-up pass, as RMM's replay benchmark does
  spread      (3rd quartile - 1st quartile) / median of those repetitions (- with one)
  footprint   the most memory the resource held at once (a pool's size; the bytes the device
              charged for a source resource: whole 2 MiB pages from 2 MiB, else 256 B units)
  overhead    footprint / peak bytes in use (1.00: it held no more than the log needed)
  waste       internal waste at the peak: bytes of the blocks holding the live allocations
              minus the bytes they asked for (bin, block and page rounding)
  frag@peak   external fragmentation, 1 - largest free block / free bytes, at the peak in
  frag@end    use and after the last event (0: all free memory in one block; a resource
              that holds nothing free shows 0)
  failed      allocations that failed with out of memory (their frees are skipped)
  beyond      managed memory only: the most bytes beyond the simulated device at once, what
              would live in host memory (oversubscription) had the log run with managed memory
  tiers       tiered only (a line under the row): each tier's peak bytes and allocations served
              (device, then the peer GPU, then host memory; a tier full passes a request on)
  host pages  on a GPU, rows that took pinned host pages (a line under the row): what the
              process's host page supply made for them and how many takes found pages made
              before (the pinned kinds share the supply: a later row reuses a former's pages)
  sleep       expandable pools only (a line under the row): a sleep after the last event
              releases every mapped byte of the device, copying the live bytes to host memory
              first (free pages are released without a copy); at the pool's peak it would
              release its peak footprint
  driver      what the replay engine called: rust, an rrmm resource directly (every rrmm
              row); python, an allocator's Python functions, each call through Python with
              the GIL taken for it (the torch and cupy rows, and "R (python)")
A "-" is a figure the resource does not report (CUDA's own allocators hold no footprint that
rrmm can see).
With --fit: the smallest simulated device on which the log replays into each resource with no
failed allocation (the search: up from the log's peak in steps of 1% of the size or 64 MiB,
whichever is finer; past about twice the peak, doubling, then halving the bracket to that
step), and the pool sizes that do it (managed memory and fallback:
with no byte beyond the device; tiered: with no byte in host memory, a peer GPU of the same size
beside it). The size after it (failing_bytes in --json) is the largest tried that is too small:
allocations fail there, or the resource cannot be built on it ("fails on"), or, for those that
never fail for want of device memory, bytes go beyond the device or reach host memory (the line
says which).
Other libraries' allocators, on a GPU, named in --compare (their packages installed):
  torch       PyTorch's caching allocator: torch.cuda.caching_allocator_alloc(size, device,
              stream) and caching_allocator_delete, one torch.cuda.Stream per stream of the
              log (its default stream for the log's default stream); its cache emptied first.
              footprint: the most torch.cuda.memory_reserved() after any allocation;
              frag@peak/end from torch.cuda.memory_snapshot()'s inactive blocks, taken in the
              untimed pass at the last peak in use and after the last event
  cupy        a fresh cupy.cuda.MemoryPool: pool.malloc(size) with the log's stream current,
              each pointer kept until the log frees it; footprint: the peak of
              pool.total_bytes(); no fragmentation (CuPy does not show its free blocks)
  R (python)  each rrmm resource R named beside them, built as its Rust row is, replayed the
              same way through rrmm's Python API (mr.allocate, mr.deallocate):
              the like-for-like baseline (footprint and fragmentation where its PyTorch-style
              statistics give them: pools). A python row's ns/event includes the interpreter
              and each library's Python call: compare python rows with python rows (the line
              under the table gives the ratios), rust rows with rust rows.
  Python rows show no waste (their blocks are not known); their failed allocations are
  counted and their frees skipped, by the engine itself. With --fit, torch and cupy get the
  smallest memory limit on the GPU (set_per_process_memory_fraction, MemoryPool.set_limit)
  under which the log replays with no failure, searched as the simulated device is.
On simulated memory cuda and cuda_async (and pinned, when named) are the simulated device
itself: one row named "simulated" (in the table, the fit lines, --json and the plot), whose
timings are the simulator's, not CUDA's; the line under the table says which resources it
stands for. managed (and managed_pool) is its own row: the simulated device with host memory
beyond it, where allocations past the device succeed and "beyond" says how many bytes would
live in host memory at the worst moment. tiered is a pool over the simulated device, then a
simulated peer GPU of --peer-memory (default: the device's size), then --host-memory of host
memory (default: no limit); on a GPU, the peer GPU is the first with a peer link (none: the row
says "no peer link") and host memory is pinned.
A SIZE is bytes as rrmm.parse_bytes (RMM's parse_bytes, the one size parser of rrmm: the
command line, reinitialize and rrmm.dask alike) reads them: 1000000, or a number and a unit,
80GiB, 512 MiB, 1.5GB; KiB to PiB are powers of 1024, KB to PB powers of 1000 (as in RMM).
A bare unit (4G, 2k) is not a size: tools disagree on whether it means 4 GiB or 4 GB. The
largest size is 2**64 - 1 bytes; a simulated device, peer GPU or host memory is at most 32 PiB.
A resource option that none of the resources replayed reads (--peer-memory without tiered,
--block-size without fixed_size) is a usage error, as is --resource with --compare.
"""

#: RMM's size grammar (``rrmm.parse_bytes``, ``rrmm::python::resources::convert``): a text of
#: this shape that parse_bytes refuses is one whose value is past 2**64 - 1.
_SIZE_GRAMMAR = re.compile(r"([0-9]+(?:\.[0-9]*)?)[\t ]*((?i:(?:[kmgtp]i?)?b))?\n?")


def parse_size(text: str) -> int:
    """A SIZE option, parsed by ``rrmm.parse_bytes``, the package's one size parser (so
    ``--initial-pool-size X`` means what ``reinitialize(initial_pool_size="X")`` and
    ``RRMMSetup(simulate="X")`` mean); its ValueError becomes argparse's one-line usage error."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        if _SIZE_GRAMMAR.fullmatch(text):
            raise argparse.ArgumentTypeError(
                f"{text!r} is too large: the largest size is {(1 << 64) - 1} bytes "
                "(2**64 - 1, just under 16 EiB)") from None
        raise argparse.ArgumentTypeError(f"{error} (sizes: 80GiB, 512 MiB, 1.5GB, 1000000)"
                                         ) from None


def _positive_size(text: str) -> int:
    value = parse_size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"needs a positive size, got {text!r}")
    return value


class GivenSize(int):
    """A size of the command line that remembers its text (``--simulate 80``: a bare number,
    bytes, where ``80GiB`` was likely meant)."""

    text: str

    def __new__(cls, value: int, text: str) -> Self:
        size = super().__new__(cls, value)
        size.text = text
        return size

    @property
    def bare(self) -> bool:
        """Whether the text is a number without a unit."""
        return self.text.strip().isdigit()


def _simulated_size(text: str) -> GivenSize:
    """A positive size of simulated memory (a device, a peer GPU, host memory): at most
    :data:`MAX_SIMULATED_BYTES`."""
    value = _positive_size(text)
    if value > MAX_SIMULATED_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text!r} ({value} bytes) is more than simulated memory can be: at most "
            f"{format_bytes(MAX_SIMULATED_BYTES)} ({MAX_SIMULATED_BYTES} bytes)")
    return GivenSize(value, text)


def _device_below_requests(simulate: GivenSize | None, files: list[str],
                           shown: dict[str, str]) -> str | None:
    """Why ``--simulate N``, a bare number of bytes smaller than a log's largest request, is
    refused (a unit left out: every such request would fail, and ``NGiB`` was likely meant),
    or None. With a unit the size is taken as meant (a small device is a question one may ask:
    the replay warns)."""
    if simulate is None or not simulate.bare:
        return None
    from rrmm import _rrmm

    for path in files:
        largest = _rrmm.ReplayLog(path, True).facts["log_largest_request"]
        if largest > simulate:
            return (f"--simulate {simulate.text}: a simulated device of {int(simulate)} bytes "
                    f"(a number without a unit is bytes) is smaller than the largest request "
                    f"of {shown.get(path, path)} ({format_bytes(largest)}), so every such "
                    f"request would fail: did you mean --simulate {simulate.text.strip()}GiB?")
    return None


def _positive_int(limit: int) -> Callable[[str], int]:
    """An argparse type: a whole number in 1..=limit (a usage error otherwise, never an
    OverflowError from deeper down)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not 0 < value <= limit:
            raise argparse.ArgumentTypeError(
                f"needs a positive whole number (at most {limit}), got {text!r}"
            )
        return value

    return parse


def parse_bins(text: str) -> tuple[int, int]:
    """Parse ``--bins MIN:MAX`` (powers of two: bins of 2^MIN..2^MAX bytes)."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX exponents such as 18:22, got {text!r}")
    low, high = int(match.group(1)), int(match.group(2))
    if low > high or high >= 64:
        raise argparse.ArgumentTypeError(f"need MIN <= MAX < 64, got {text!r}")
    return low, high


def format_bytes(value: int | None) -> str:
    """Human-readable bytes (binary units), ``-`` for None."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{value} B"  # pragma: no cover


def _format_fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` command to ``subparsers``; sets ``run`` to :func:`run`."""
    from rrmm import _rrmm

    summaries = "\n".join(
        f"  {name:<11} {summary}" for name, summary in _rrmm.replay_resource_summaries()
    )
    parser = subparsers.add_parser(
        "replay",
        help="replay RMM-format allocation logs against memory resources",
        description=__doc__,
        epilog=f"Resources:\n{summaries}\n\n{DEFINITIONS}\n{RECORDING}\n\n{EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "logs",
        metavar="LOG",
        nargs="+",
        help="RMM-format CSV log (plain or .gz), or the name of a log shipped with rrmm "
        "(transformer_training, random_10k_1mib, random_100k_4mib)",
    )
    parser.add_argument(
        "--resource",
        default=None,
        help="the resource to replay against (see Resources below; default: pool); not "
        "with --compare",
    )
    parser.add_argument(
        "--compare",
        metavar="R1,R2,...",
        help="replay against each of these resources, one row each ('all': every resource "
        "below, the source resources as one 'simulated' row on simulated memory; on a GPU "
        "all but pinned, pinned_pool and pinned_expandable, which pin host memory: name "
        "them); on a GPU also torch and cupy (PyTorch's and CuPy's allocators, from "
        "Python, with each rrmm resource named also driven from Python)",
    )
    parser.add_argument(
        "--simulate",
        metavar="SIZE",
        type=_simulated_size,
        help="replay on a simulated device of SIZE bytes (e.g. 80GiB, at most 32PiB) instead "
        "of the GPU (default without a GPU: 80GiB)",
    )
    parser.add_argument(
        "--initial-pool-size",
        metavar="SIZE",
        type=parse_size,
        help="initial size of the pool (pool, binning); default: half the device's free memory",
    )
    parser.add_argument(
        "--maximum-pool-size",
        metavar="SIZE",
        type=parse_size,
        help="largest size the pool may grow to (pool, binning); default: the device",
    )
    parser.add_argument(
        "--bins",
        metavar="MIN:MAX",
        type=parse_bins,
        help="binning's bins: 2^MIN..2^MAX bytes (default 18:22, 256 KiB..4 MiB)",
    )
    parser.add_argument(
        "--block-size",
        metavar="SIZE",
        type=_positive_size,
        help="fixed_size's block size (default 1MiB); larger requests fail by design",
    )
    parser.add_argument(
        "--blocks",
        metavar="N",
        type=_positive_int(1 << 32),
        help="blocks per chunk of fixed_size and of binning's bins (default 128)",
    )
    parser.add_argument(
        "--arena-size",
        metavar="SIZE",
        type=_positive_size,
        help="arena's global arena (default: half the device's free memory)",
    )
    parser.add_argument(
        "--host-memory",
        metavar="SIZE",
        type=_simulated_size,
        help="managed, managed_pool, fallback and tiered on a simulated device: host memory "
        "beyond the device (default: no limit), so the replay says how much would live there",
    )
    parser.add_argument(
        "--peer-memory",
        metavar="SIZE",
        type=_simulated_size,
        help="tiered on a simulated device: the memory of the simulated peer GPU, the tier "
        "after the device and before host memory (default: the device's size)",
    )
    parser.add_argument(
        "--repeat",
        metavar="N",
        type=_positive_int(1_000_000),
        help="timed repetitions after the warm-up pass, on the same resource "
        "(default: at least 5 and at least 0.5 s of them, at most 1000)",
    )
    parser.add_argument(
        "--fit",
        action="store_true",
        help="also find, per resource, the smallest simulated device on which the log replays "
        "with no failed allocation (the search: see With --fit below)",
    )
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        help="draw memory over the events to the file OUT (.png, .pdf, .svg, .jpg; a path: "
        "relative to the current directory, which is where a bare name goes); needs matplotlib",
    )
    parser.add_argument("--json", action="store_true",
                        help="print the reports as JSON on standard output, each with its "
                        f"timeline (about {PLOT_POINTS} points: events, bytes in use, "
                        "footprint, bytes beyond the device)")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar (it is drawn on standard error only when that is a terminal)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 3 when any allocation failed (or could not be served) on any "
        "resource: a CI job can gate on 'this log fits with these settings'",
    )
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="skip bad lines of a log with a counted warning instead of stopping",
    )
    parser.set_defaults(run=run)
    one_line_parser_errors(parser, "rrmm replay")
    return parser


def _compared(text: str, known: Sequence[str]) -> list[str]:
    """The names of ``--compare TEXT``; ValueError for a list with no name or an empty one
    (``pool,,binning``: a slip that would leave a resource out unseen)."""
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise ValueError(f"--compare names no resource (got {text!r}); "
                         f"known: {', '.join(known)}, all")
    if "" in names:
        raise ValueError(f"--compare {text!r}: name {names.index('') + 1} of {len(names)} is "
                         "empty; separate the names with single commas")
    return names


def _every_resource(simulated: bool, known: Sequence[str]) -> list[str]:
    """``--compare all``: every resource kind replay builds, once. On simulated memory the
    source resources are the one ``simulated`` row and every other kind runs (tiered over a
    simulated peer GPU, the pinned kinds over simulated host memory); on a GPU, every kind but
    the pinned host kinds, which pin host memory of the device's scale (named, they run)."""
    if simulated:
        return [n for n in known if n not in SOURCE_RESOURCES]
    return [n for n in known if n != "simulated" and n not in HOST_RESOURCES]


def _resources(args: argparse.Namespace, simulated: bool, known: Sequence[str]) -> list[str]:
    """The canonical resource names to replay, in order, without duplicates; on simulated
    memory the source resources collapse into the one simulated device. ValueError on misuse."""
    if args.compare is not None and args.resource is not None:
        raise ValueError(f"--resource {args.resource!r} and --compare {args.compare!r} both "
                         "given: --resource replays one resource, --compare several; use one")
    if args.compare is not None:
        names = _compared(args.compare, known)
        if [n.lower() for n in names] == ["all"]:
            return _every_resource(simulated, known)
    else:
        names = [(args.resource if args.resource is not None else "pool").strip()]
    out: list[str] = []
    for name in names:
        canonical = name.lower().replace("-", "_")
        if canonical in PEERS:
            if canonical not in out:
                out.append(canonical)
            continue
        if canonical not in known:
            raise ValueError(f"unknown resource {name!r}; known: {', '.join(known)}; "
                             f"on a GPU also {', '.join(PEERS)}")
        if simulated and canonical in SOURCE_RESOURCES:
            canonical = "simulated"
        if canonical == "simulated" and not simulated:
            raise ValueError("resource 'simulated' needs --simulate SIZE")
        if canonical not in out:
            out.append(canonical)
    return out


def _asked(args: argparse.Namespace) -> list[str] | None:
    """The resource names as asked (canonical spelling, before the source resources collapse
    into ``simulated``); None for ``--compare all``."""
    text = args.compare if args.compare is not None else (args.resource or "pool")
    names = [n.strip().lower().replace("-", "_") for n in text.split(",") if n.strip()]
    return None if names == ["all"] else names


def _unread_option(args: argparse.Namespace, named: Sequence[str], simulated: bool) -> str | None:
    """Why a resource option given would change nothing (no resource replayed reads it, or it
    is read on a simulated device only), or None: such an option is a usage error."""
    replayed = [n for n in named if n not in PEERS]
    for option, readers in OPTION_READERS.items():
        if getattr(args, option) is None:
            continue
        flag = "--" + option.replace("_", "-")
        if option in SIMULATED_ONLY_OPTIONS and not simulated:
            return (f"{flag} is read on a simulated device only (--simulate SIZE): on the GPU, "
                    "host memory and the peer GPU are the machine's own")
        if not set(readers) & set(replayed):
            stands = (" (on simulated memory cuda, cuda_async and pinned are the simulated "
                      "device itself)" if "simulated" in replayed else "")
            return (f"{flag} would change nothing: only {', '.join(readers)} read it, and "
                    f"the resources replayed ({', '.join(replayed) or 'none'}) do not{stands}")
    return None


def _too_much_host_memory(args: argparse.Namespace, named: Sequence[str],
                          simulate: int | None) -> str | None:
    """Why --host-memory with --simulate is more than managed memory can simulate (the device
    and its host memory are one simulated range, at most 32 PiB together), or None."""
    host = args.host_memory
    if host is None or simulate is None or not set(MANAGED_RESOURCES) & set(named):
        return None
    if simulate + host <= MAX_SIMULATED_BYTES:
        return None
    return (f"--host-memory {host} with a simulated device of {simulate} bytes is more than "
            f"managed memory can simulate: the device and its host memory are at most "
            f"{MAX_SIMULATED_BYTES} bytes ({format_bytes(MAX_SIMULATED_BYTES)}) together, so "
            f"at most {MAX_SIMULATED_BYTES - simulate} bytes of host memory here")


def _option_problem(args: argparse.Namespace, named: Sequence[str],
                    simulate: int | None) -> str | None:
    """Why the resource options given cannot be used as they are (``simulate``: the simulated
    device's size, None on the GPU), or None."""
    for option, value in (("--initial-pool-size", args.initial_pool_size),
                          ("--maximum-pool-size", args.maximum_pool_size)):
        if value is not None and value % 256:
            return f"{option} must be a multiple of 256 bytes (RMM's rule), got {value}"
    if (args.initial_pool_size is not None and args.maximum_pool_size is not None
            and args.initial_pool_size > args.maximum_pool_size):
        return (f"--initial-pool-size {args.initial_pool_size} exceeds --maximum-pool-size "
                f"{args.maximum_pool_size}")
    return (_unread_option(args, named, simulate is not None)
            or _too_much_host_memory(args, named, simulate))


def _check_plot_path(path: str) -> str | None:
    """Why ``--plot PATH`` cannot be written, or None."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in PLOT_FORMATS:
        return (f"--plot {path!r}: unknown file type {extension or '(none)'!r}; "
                f"use one of {', '.join(PLOT_FORMATS)}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"--plot {path!r}: directory {directory!r} does not exist"
    if os.path.isdir(path):
        return f"--plot {path!r} is a directory"
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"--plot {path!r}: not writable"
    return None


def _row_name(r: ReplayRecord) -> str:
    """A row's name in the table, the plot and the fit lines: the resource's name (``simulated``
    for the simulated device's own row, as in ``--json`` and ``--resource simulated``), with
    `` (python)`` for an rrmm resource driven from Python."""
    if r["driver"] == PYTHON_DRIVER and r["resource"] not in PEERS:
        return f"{r['resource']} (python)"
    return r["resource"]


def _table(reports: list[ReplayRecord]) -> str:
    header = ["resource", "ns/event", "spread", "footprint", "overhead", "waste",
              "frag@peak", "frag@end", "failed"]
    drivers = any(r["driver"] != "rust" for r in reports)
    if drivers:
        header.insert(1, "driver")
    beyond = any(r.get("peak_beyond_device") is not None for r in reports)
    if beyond:
        header.append("beyond")
    rows = []
    for r in reports:
        first = [_row_name(r)] + ([r["driver"]] if drivers else [])
        if r["error"] is not None:
            rows.append(first + ["-"] * (len(header) - len(first)))
            continue
        failed = str(r["failed_allocations"])
        if r["failed_allocations"]:
            failed += " !"
        overhead = "-" if r["overhead"] is None else f"{r['overhead']:.2f}"
        rows.append(first + [
            f"{r['ns_per_event']:.1f}",
            "-" if r["spread"] is None else f"{100 * r['spread']:.0f}%",
            format_bytes(r["peak_footprint"]),
            overhead,
            format_bytes(r["internal_waste_at_peak"]),
            _format_fraction(r["fragmentation_at_peak"]),
            _format_fraction(r["fragmentation_at_end"]),
            failed,
        ] + ([format_bytes(r.get("peak_beyond_device"))] if beyond else []))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    left = 2 if drivers else 1

    def line(cells: list[str]) -> str:
        # The resource (and driver) columns are left-aligned, the figures right-aligned.
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    lines = [line(header), "  ".join("-" * w for w in widths)]
    lines.extend(line(row) for row in rows)
    return "\n".join(lines)


def _python_ratios(reports: list[ReplayRecord]) -> str | None:
    """The like-for-like line: each peer's ns/event over the first rrmm row driven from Python
    (both through Python calls), or None without both."""
    reference = next((r for r in reports if r["driver"] == PYTHON_DRIVER
                      and r["resource"] not in PEERS and r["ns_per_event"]), None)
    peers = [r for r in reports if r["resource"] in PEERS and r["ns_per_event"] is not None]
    if reference is None or reference["ns_per_event"] is None or not peers:
        return None
    ratios = ", ".join(f"{r['resource']} {r['ns_per_event'] / reference['ns_per_event']:.2f}x"
                       for r in peers if r["ns_per_event"] is not None)
    return f"  driven from Python alike, ns/event relative to {_row_name(reference)}: {ratios}"


def _spills_to(row: ReplayRecord | None) -> str | None:
    """Where a resource that never fails for want of device memory puts what the device cannot
    hold, as its ``--fit`` judges it from its row: "host memory" (tiered: its last tier),
    "beyond the device" (managed memory, fallback); None for the others."""
    if row is not None and row.get("tiers"):
        return "host memory"
    if row is not None and row.get("peak_beyond_device") is not None:
        return "beyond the device"
    return None


def _too_small(f: FitRecord, row: ReplayRecord | None) -> str:
    """What goes wrong on the largest device the fit found too small (``failing_bytes``)."""
    size = format_bytes(f["failing_bytes"])
    spill = _spills_to(row)
    if spill == "host memory":
        return f"on {size} some bytes reach host memory"
    if spill is not None:
        return f"on {size} some bytes go {spill}"
    return f"fails on {size}"


def _fit_heading(fits: Sequence[FitRecord], rows: dict[tuple[str, str], ReplayRecord]) -> str:
    """The line over the fits: what fitting means for each kind among them."""
    spills = {_spills_to(rows.get((f["resource"], f["driver"]))) for f in fits}
    words = "smallest simulated device with no failed allocation"
    if "beyond the device" in spills:
        words += "; managed memory and fallback: with no byte beyond the device"
    if "host memory" in spills:
        words += "; tiered: with no byte in host memory"
    if any(f["driver"] == PYTHON_DRIVER for f in fits):
        words += "; for torch and cupy the smallest memory limit on the GPU"
    return f"  fit ({words}):"


def _fit_line(f: FitRecord, row: ReplayRecord | None = None) -> str:
    name = f["resource"]
    if f["driver"] == PYTHON_DRIVER and name not in PEERS:
        name = f"{name} (python)"
    if f["driver"] == PYTHON_DRIVER:
        if f["device_bytes"] is None:
            return f"{name} fits under no limit: {f['reason']} ({f['setup']})"
        return (f"{name} needs {format_bytes(f['device_bytes'])}: {f['setup']} (fails under "
                f"{format_bytes(f['failing_bytes'])})")
    if f["device_bytes"] is None:
        return f"{name} fits on no device: {f['reason']}"
    text = f"{name} needs {format_bytes(f['device_bytes'])}"
    if f.get("initial_pool_size") is not None:
        maximum = f.get("maximum_pool_size")
        text += (f" with initial_pool_size={f['initial_pool_size']} "
                 f"({format_bytes(f['initial_pool_size'])}), maximum_pool_size="
                 f"{maximum if maximum is not None else 'None'}")
    if f.get("arena_size") is not None:
        text += f" with arena_size={f['arena_size']} ({format_bytes(f['arena_size'])})"
    text += f" ({_too_small(f, row)})"
    return text


def _print_text(reports: list[ReplayRecord], fits: list[FitRecord], target: str,
                shown: dict[str, str], out: Any, named: Sequence[str] | None = None) -> None:
    logs: dict[str, list[ReplayRecord]] = {}
    for r in reports:
        logs.setdefault(r["log"], []).append(r)
    for log, rs in logs.items():
        first = rs[0]
        leaks = first["log_unfreed_allocations"]
        print(f"{shown.get(log, log)}: {first['events']} events, {first['threads']} thread(s), "
              f"{first['streams']} stream(s), peak {format_bytes(first['log_peak_bytes'])} "
              f"in use; {leaks} allocation(s) never freed, {first['logged_failures']} "
              f"failed allocation(s) logged (not replayed); on {target}", file=out)
        if first["parse_warnings"]:
            print(f"  {first['parse_warnings']} bad line(s) skipped (--lenient):", file=out)
            for message in first["warning_messages"]:
                print(f"    {message}", file=out)
        print(_table(rs), file=out)
        ratios = _python_ratios(rs)
        if ratios is not None:
            print(ratios, file=out)
        repeats = [r["repeats"] for r in rs if r["repeats"] is not None]
        if repeats:
            # One count per row, in the rows' order (one count when all rows ran as many).
            counts = "/".join(str(n) for n in (repeats[:1] if len(set(repeats)) == 1
                                               else repeats))
            print(f"  timings: median of {counts} repetition(s) after a warm-up, on one "
                  "resource per row", file=out)
        for r in rs:
            setup = _setup(r, named) or "-"
            print(f"  {_row_name(r)}: {setup}", file=out)
            if r["error"] is not None:
                print(f"    no figures: {r['error']}", file=out)
                continue
            if r["failed_allocations"] and r["failure_events"] is not None:
                shown_events = ", ".join(str(i) for i in r["failure_events"][:10])
                more = " ..." if r["failed_allocations"] > 10 else ""
                print(f"    {r['failed_allocations']} allocation(s) failed "
                      f"({format_bytes(r['failed_bytes'])}), at events {shown_events}{more}",
                      file=out)
            if r["unservable_allocations"]:
                print(f"    {r['unservable_allocations']} of them ask for more than its block "
                      "size: it cannot serve them by design", file=out)
            for extra in (_tiers_line(r), _host_pages_line(r), _sleep_line(r)):
                if extra is not None:
                    print(f"    {extra}", file=out)
        if any(r["simulated_device"] for r in rs):
            print("  (simulated: the simulated device itself; its timings are the simulator's, "
                  "not CUDA's)", file=out)
        log_fits = [f for f in fits if f["log"] == log]
        if log_fits:
            rows = {(r["resource"], r["driver"]): r for r in rs}
            print(_fit_heading(log_fits, rows), file=out)
            for f in log_fits:
                print(f"    {_fit_line(f, rows.get((f['resource'], f['driver'])))}", file=out)
        print(file=out)


def _tiers_line(r: ReplayRecord) -> str | None:
    """A tiered row's counts per tier in words, or None for other rows."""
    tiers = r.get("tiers")
    if not tiers:
        return None
    parts = [f"{t['name']} peak {format_bytes(t['peak_bytes'])} ({t['total_allocations']} "
             f"allocation(s), {t['refused']} passed on)" for t in tiers]
    return "tiers: " + ", ".join(parts)


def _host_pages_line(r: ReplayRecord) -> str | None:
    """What the row's resource took from the process's host page supply, or None where it
    took nothing (everything on simulated memory)."""
    used = r.get("host_pages")
    if not used:
        return None
    return (f"host pages: {format_bytes(used['made_bytes'])} made in {used['made_ranges']} "
            f"range(s), {used['reused_takes']} take(s) served by pages made before; the "
            f"process's supply held {format_bytes(used['held_bytes_at_end'])} after the last "
            "event")


def _replay_detail(bar: Progress) -> Callable[[int, int, float, int], None]:
    """The replay engine's progress call (events done, events in all, seconds, timed
    repetitions done), shown in the bar's current step."""

    def show(done: int, total: int, seconds: float, repetitions: int) -> None:
        if repetitions:
            bar.detail(f"{repetitions} timed repetition(s), {seconds:.1f}s")
        else:
            share = 100.0 * done / total if total else 100.0
            bar.detail(f"{share:5.1f}% of {total} events")

    return show


def _fit_detail(bar: Progress) -> Callable[[int, int, bool], None]:
    """The fit's progress call (sizes tried, the size just tried, whether the log fitted it),
    shown in the bar's current step: a long fit's search moves the bar."""

    def show(tries: int, device_bytes: int, fits: bool) -> None:
        verdict = "fits" if fits else "does not fit"
        bar.detail(f"try {tries}: {format_bytes(device_bytes)} {verdict}")

    return show


def _sleep_line(r: ReplayRecord) -> str | None:
    """What a sleep of an expandable pool would release and copy, or None for other rows."""
    releases = r.get("sleep_releases_at_end")
    if releases is None:
        return None
    copies = r.get("sleep_copies_at_end") or 0
    memory = "pinned host memory" if r["resource"] in HOST_RESOURCES else "device memory"
    text = (f"sleep: after the last event it would release {format_bytes(releases)} of {memory}, "
            f"copying {format_bytes(copies)} of live data to host memory "
            f"({format_bytes(max(releases - copies, 0))} released without a copy)")
    peak = r.get("sleep_releases_at_peak")
    if peak is not None:
        text += f"; at the pool's peak, {format_bytes(peak)}"
    return text


def _stands_for(named: Sequence[str] | None) -> str:
    """The source resources the ``simulated`` row stands for, in words: those named that it
    replaced (``--resource pinned --simulate``: pinned), else cuda and cuda_async."""
    names = [n for n in (named or ()) if n in SOURCE_RESOURCES] or ["cuda", "cuda_async"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _setup(r: ReplayRecord, named: Sequence[str] | None = None) -> str | None:
    """A row's setup line; the ``simulated`` row's says which of the resources asked for it
    stands for (managed has its own row)."""
    setup = r["setup"]
    if setup is None or not r["simulated_device"]:
        return setup
    head = setup.split("; stands for", 1)[0]
    return f"{head}; stands for {_stands_for(named)}"


def _json_report(r: ReplayRecord, shown: dict[str, str],
                 named: Sequence[str] | None = None) -> dict[str, Any]:
    out = dict(r)
    out["setup"] = _setup(r, named)
    out["log"] = shown.get(r["log"], r["log"])
    return out


def plot(reports: list[ReplayRecord], path: str, fits: Sequence[FitRecord] = (),
         shown: dict[str, str] | None = None) -> None:
    """Draw bytes in use and each resource's footprint over the events, one panel per log, to
    ``path``: bytes in use once (black), each resource in its own colour and line style, its
    failed allocations as markers of its colour, its ``--fit`` size as a dotted line; the
    legend outside the data.

    Raises ImportError with an installation hint when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"--plot needs matplotlib: {PLOT_INSTALL_HINT}") from e

    shown = shown or {}
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text
        _draw(plt, reports, path, fits, shown)


def _draw(plt: Any, reports: list[ReplayRecord], path: str, fits: Sequence[FitRecord],
          shown: dict[str, str]) -> None:
    logs: dict[str, list[ReplayRecord]] = {}
    for r in reports:
        if r["error"] is None:
            logs.setdefault(r["log"], []).append(r)
    if not logs:
        logs = {r["log"]: [] for r in reports}
    fig, axes = plt.subplots(len(logs), 1, figsize=(12, 4.5 * len(logs)), squeeze=False)
    gib = float(1 << 30)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1))]
    markers = ["x", "+", "v", "^", "s", "D", "o"]
    for ax, (log, rs) in zip(axes[:, 0], logs.items()):
        drawn_in_use: list[list[int]] = []
        for index, r in enumerate(rs):
            colour = colours[index % len(colours)]
            t = r["timeline"]
            if t is None:
                continue
            events, in_use = t["event"], t["bytes_in_use"]
            # Bytes in use are the same for every resource unless allocations failed.
            if in_use not in drawn_in_use:
                label = "bytes in use" if not drawn_in_use else f"bytes in use ({_row_name(r)})"
                ax.plot(events, [b / gib for b in in_use], color="black" if not drawn_in_use
                        else colour, linewidth=2.4 if not drawn_in_use else 1.0, alpha=0.8,
                        label=label, zorder=2)
                drawn_in_use.append(in_use)
            points = [(e, f) for e, f in zip(events, t["footprint"]) if f is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] / gib for p in points],
                        linestyle=styles[index % len(styles)], color=colour, linewidth=1.6,
                        label=f"{_row_name(r)}: footprint", zorder=3)
            beyond = [(e, b) for e, b in zip(events, t.get("beyond_device") or [])
                      if b is not None]
            if any(b for _, b in beyond):
                ax.fill_between([p[0] for p in beyond], [p[1] / gib for p in beyond],
                                step="post", color=colour, alpha=0.25,
                                label=f"{_row_name(r)}: beyond the device (host memory)",
                                zorder=1)
            if r["failure_events"] and events:
                ys = []
                for e in r["failure_events"]:
                    # The bytes in use at the nearest recorded point before the failure.
                    lo, hi = 0, len(events) - 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if events[mid] <= e:
                            lo = mid
                        else:
                            hi = mid - 1
                    ys.append(in_use[lo] / gib)
                ax.scatter(r["failure_events"], ys, marker=markers[index % len(markers)],
                           color=colour, s=22, zorder=5,
                           label=f"{_row_name(r)}: failed ({r['failed_allocations']})")
            for f in fits:
                if f["log"] == log and f["resource"] == r["resource"] and f["device_bytes"]:
                    ax.axhline(f["device_bytes"] / gib, color=colour, linestyle=":",
                               linewidth=1.0, label=f"{_row_name(r)}: fits in "
                               f"{format_bytes(f['device_bytes'])}")
        ax.set_title(os.path.basename(shown.get(log, log)))
        ax.set_xlabel("event")
        ax.set_ylabel("GiB")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _sizing(args: argparse.Namespace) -> dict[str, Any]:
    """The resource options of the command line (pool sizes, bins, blocks, arena, host and peer
    memory) as keyword arguments of the engine's `replay_logs`/`fit_logs` and of `_stack.build`."""
    return {name: getattr(args, name) for name in (
        "initial_pool_size", "maximum_pool_size", "bins", "block_size", "blocks", "arena_size",
        "host_memory", "peer_memory")}


def _python_rows(args: argparse.Namespace, files: list[str], names: list[str],
                 reports: list[ReplayRecord], fits: list[FitRecord], modules: dict[str, Any],
                 simulate: int | None) -> tuple[list[ReplayRecord], list[FitRecord]]:
    """The rows driven from Python (the peers, and each rrmm resource beside them) merged into
    the engine's, and the peers' fits after the engine's."""
    rows = _replay_peers.replay_rows(files, names, reports, modules, options=_sizing(args),
                                     simulate=simulate, repeat=args.repeat, lenient=args.lenient)
    if args.fit:
        peers = [n for n in names if n in PEERS]
        fits = fits + _replay_peers.fit_rows(files, peers, modules, lenient=args.lenient,
                                             gpu=simulate is None)
    return rows, fits


def _warn_device_below_requests(reports: list[ReplayRecord], simulate: int,
                                shown: dict[str, str]) -> None:
    """One line on standard error per log with a request larger than the whole simulated
    device: every such request fails, whatever the resource (``--simulate N`` without a unit is
    refused before: :func:`_device_below_requests`)."""
    largest: dict[str, int] = {}
    for r in reports:
        largest[r["log"]] = max(largest.get(r["log"], 0), r["log_largest_request"])
    for log, request in largest.items():
        if request > simulate:
            print(f"rrmm replay: warning: the simulated device ({format_bytes(simulate)}, "
                  f"--simulate {simulate}) is smaller than the largest request of "
                  f"{shown.get(log, log)} ({format_bytes(request)}, {request} bytes): every "
                  "such request fails, whatever the resource", file=sys.stderr)


#: An option the engine refuses, in its Python name (``invalid argument `simulate`: ...``).
_REFUSED_OPTION = re.compile(r"invalid argument `([a-z_]+)`: ")


def _in_cli_words(text: str, args: argparse.Namespace, shown: dict[str, str]) -> str:
    """An engine's message said as the command line's: an option by its flag and the value
    given (``--simulate 80: ...``), a shipped log by its name, not its installed path."""

    def flag(found: re.Match[str]) -> str:
        name = found.group(1)
        given = getattr(args, name, None)
        option = "--" + name.replace("_", "-")
        return f"{option} {given}: " if given is not None else f"{option}: "

    text = _REFUSED_OPTION.sub(flag, text)
    for name in (*_sizing(args), "simulate"):  # a pool's own words: (arena_size=1: ...)
        text = text.replace(f"{name}=", "--" + name.replace("_", "-") + " ")
    for path, name in shown.items():
        if path != name:
            text = text.replace(path, name)
    return text


def run(args: argparse.Namespace) -> int:
    """Run ``rrmm replay`` with parsed arguments; returns the exit status (0 ok, 1 plotting
    impossible, 2 bad input or arguments, 3 with ``--check`` when an allocation failed)."""
    from rrmm import _rrmm

    def fail(message: str, code: int = USAGE) -> int:
        return fail_with("rrmm replay", message, code)

    known = list(_rrmm.replay_resource_names())
    simulate = args.simulate
    gpu = simulate is None and bool(_rrmm.replay_gpu_available())
    try:
        named = _resources(args, simulate is not None or not gpu, known)
    except ValueError as e:
        return fail(str(e))
    args_named = _asked(args)
    peers = [n for n in named if n in PEERS]
    defaulted = simulate is None and not gpu
    if defaulted:
        simulate = DEFAULT_SIMULATED_BYTES
    problem = (_replay_peers.peer_problem(peers, args.simulate, gpu)
               or _option_problem(args, named, simulate))
    if problem is not None:
        return fail(problem)
    resolved = [resolve_log(log) for log in args.logs]
    for path, _ in resolved:
        if not os.path.exists(path):
            return fail(missing_log(path))
    if defaulted and not args.quiet:
        print(f"rrmm replay: no GPU found; replaying on simulated memory of "
              f"{format_bytes(simulate)} (--simulate SIZE to choose)", file=sys.stderr)
    resources = [n for n in named if n not in PEERS]
    if args.plot:
        problem = _check_plot_path(args.plot)
        if problem:
            return fail(problem)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail(f"--plot needs matplotlib: {PLOT_INSTALL_HINT}", code=1)
    try:
        modules = _replay_peers.prepare_peers(peers)
    except _replay_peers.PeerUnavailable as e:
        return fail(str(e))
    shown = dict(resolved)
    files = [path for path, _ in resolved]
    try:
        problem = _device_below_requests(args.simulate, files, shown)
    except (ValueError, OSError) as e:
        return fail(_in_cli_words(error_text(e), args, shown))
    if problem is not None:
        return fail(problem)
    wanted = progress_wanted(quiet=args.quiet)
    options = {**_sizing(args), "lenient": args.lenient}
    pairs = [(path, name) for path in files for name in resources]
    steps = len(pairs) * (2 if args.fit else 1) + (1 if peers else 0)
    try:
        # One bar, a step per (log, resource); a long replay's events and timed repetitions
        # come from the engine's progress calls and show in the step's line.
        with Progress("rrmm replay", steps, enabled=wanted) as bar:
            reports = []
            for path, name in pairs:
                bar.step(f"replay {name} on {shown.get(path, path)}")
                reports += _rrmm.replay_logs(
                    [path],
                    [name],
                    simulate=simulate,
                    timeline_points=PLOT_POINTS if args.plot or args.json else 0,
                    progress=_replay_detail(bar) if wanted else None,
                    repeat=args.repeat,
                    **options,
                )
            fits = []
            if args.fit:
                for path, name in pairs:
                    bar.step(f"fit {name} on {shown.get(path, path)}")
                    fits += _rrmm.fit_logs([path], [name],
                                           progress=_fit_detail(bar) if wanted else None,
                                           **options)
            if peers:
                bar.step(f"rows driven from Python ({', '.join(peers)})")
                reports, fits = _python_rows(args, files, named, reports, fits, modules,
                                             simulate)
    except (ValueError, OSError, RuntimeError) as e:
        return fail(_in_cli_words(error_text(e), args, shown))
    except MemoryError as e:
        return fail(f"out of memory: {error_text(e)}")
    if simulate is not None:
        _warn_device_below_requests(reports, simulate, shown)
    target = (f"a simulated device of {format_bytes(simulate)}" if simulate is not None
              else "the GPU")
    if args.json:
        doc: dict[str, Any] = {
            "memory": "simulated" if simulate is not None else "gpu",
            "simulated_bytes": simulate,
            "reports": [_json_report(r, shown, named=args_named) for r in reports],
        }
        if args.fit:
            doc["fits"] = [dict(f, log=shown.get(f["log"], f["log"])) for f in fits]
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(reports, fits, target, shown, sys.stdout, args_named)
    if args.plot:
        try:
            plot(reports, args.plot, fits, shown)
        except (OSError, ValueError) as e:
            return fail(f"--plot {args.plot!r}: {e}")
        if not args.json:
            print(f"plot written to {os.path.abspath(args.plot)}")
    if args.check:
        failing = [r for r in reports
                   if r.get("failed_allocations") or r.get("unservable_allocations")
                   or r.get("error")]
        if failing:
            names = ", ".join(sorted({str(r["resource"]) for r in failing}))
            print(f"rrmm replay: --check: allocations failed on: {names}", file=sys.stderr)
            return 3
    return 0
