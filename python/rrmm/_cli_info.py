"""``python -m rrmm info``: the driver, the devices with their memory, each device's current
resource, and the shared GPUs' ledgers (``rrmm.shared_gpu``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rrmm import _rrmm


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``info`` command to the ``rrmm`` command line."""
    from rrmm._cli_common import EXIT_CODES, one_line_parser_errors

    parser = subparsers.add_parser(
        "info",
        help="driver, devices, memory and current resources",
        description="Prints the CUDA driver rrmm loads, each device with its free and total "
        "memory, the resource set for it (or the default it would get) and the host NUMA node "
        "of its pinned memory; without a driver it says why and that there are no devices "
        "(status 0: simulated memory needs no GPU). Then the shared GPUs: each ledger under "
        "RRMM_LEDGER_DIR (or the default directory) with its processes, their shares and "
        "bytes, their last events and the files it refused; it only reads the ledgers (it "
        "removes nothing, not even the entries of processes that died).",
        epilog=EXIT_CODES,
    )
    one_line_parser_errors(parser, "rrmm info")
    parser.set_defaults(run=run)
    return parser


def _resource_chain(mr: Any) -> str:
    names = []
    while mr is not None:
        names.append(type(mr).__name__)
        mr = getattr(mr, "upstream_mr", None)
    return " -> ".join(names)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


#: History events shown per process.
HISTORY_SHOWN = 5


def run(args: argparse.Namespace | None = None) -> int:
    """Prints the report; returns 0 (also without a driver)."""
    import rrmm

    print(f"rrmm {rrmm.__version__}")
    if not _rrmm.driver_available():
        print(f"CUDA driver: not available ({_rrmm.driver_error()})")
        print("devices: none")
    else:
        _devices()
    _shared_gpus()
    return 0


def _devices() -> None:
    import rrmm
    version = _rrmm.driver_version()
    print(f"CUDA driver: {version // 1000}.{(version % 1000) // 10}")
    count = _rrmm.device_count()
    print(f"devices: {count}")
    for device in range(count):
        try:
            name = _rrmm.device_name(device)
        except RuntimeError as e:
            name = f"? ({e})"
        try:
            free, total = _rrmm.device_memory_info(device)
            memory = f"{_gib(free)} free of {_gib(total)}"
        except RuntimeError as e:
            memory = f"memory unknown ({e})"
        if _rrmm.has_per_device_resource(device):
            resource = _resource_chain(rrmm.mr.get_per_device_resource(device))
        else:
            resource = "none set (CudaMemoryResource on first use)"
        node, nodes = _rrmm.host_numa_node(device)
        where = f"node {node}" if node is not None else "not reported by the driver"
        print(f"  [{device}] {name}: {memory}; resource: {resource}")
        print(f"      host NUMA node for pinned memory: {where} ({nodes} node(s) on this host)")


def _shared_gpus() -> None:
    """Every ledger under the default directory: its processes, their last events, and the
    files it refused (``rrmm.shared_gpu.read_ledgers``)."""
    from rrmm import shared_gpu
    from rrmm._cli_replay import format_bytes

    directory = _rrmm._shared_gpu_default_directory()
    ledgers = shared_gpu.read_ledgers(directory)
    if not ledgers:
        print(f"shared GPUs: none in {_printable(directory)} (join with RRMM_SHARE_GPU=1 in the "
              "environment or rrmm.reinitialize(share_gpu=True))")
        return
    print(f"shared GPUs: {len(ledgers)} ledger(s) in {_printable(directory)}")
    for key, ledger in ledgers.items():
        rows, refused = ledger["processes"], ledger["refused"]
        print(f"  {_printable(key)}: {len(rows)} process(es)")
        for row in rows:
            if row.stale:
                print(f"    pid {row.pid} {_printable(repr(row.name))} of pid namespace "
                      f"{row.pid_ns}: stale (not written for {time.time() - row.updated:.0f} s; "
                      "its process cannot be seen from here, so its entry is not removed)")
                continue
            share = "equal part" if row.soft_share is None else format_bytes(row.soft_share)
            limit = "none" if row.hard_limit is None else format_bytes(row.hard_limit) + (
                f" ({_printable(row.hard_limit_from)})" if row.hard_limit_from else "")
            print(f"    pid {row.pid} {_printable(repr(row.name))}: share {share}, "
                  f"live {format_bytes(row.live)}, cached {format_bytes(row.cached)}, asleep {format_bytes(row.asleep)}, "
                  f"idle {'yes' if row.idle else 'no'}, hard limit {limit}")
            for event in row.history[-HISTORY_SHOWN:]:
                print(f"      {_event(event)}")
        for name, why in refused:
            print(f"    refused {_printable(name)}: {_printable(why)}")


def _event(event: dict[str, Any]) -> str:
    """One history event in words: kind, peer, bytes asked and given, latency."""
    from rrmm._cli_replay import format_bytes

    peer = event.get("peer") or 0
    text = _printable(str(event.get("kind", "?"))) + (f", peer {peer}" if peer else "")
    text += (f": {format_bytes(int(event.get('bytes') or 0))}, "
             f"given {format_bytes(int(event.get('given') or 0))} "
             f"in {1000 * float(event.get('seconds') or 0.0):.1f} ms")
    if event.get("note"):
        text += f" ({_printable(str(event['note']))})"
    return text


def _printable(text: str, limit: int = 200) -> str:
    """``text`` with what a terminal would act on (escapes, new lines) shown escaped: names
    and notes come from files other processes wrote."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."
