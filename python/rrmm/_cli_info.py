"""``python -m rrmm info``: the driver, the devices with their memory, and each device's
current resource."""

from __future__ import annotations

import argparse
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
        "(status 0: simulated memory needs no GPU).",
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


def run(args: argparse.Namespace | None = None) -> int:
    """Prints the report; returns 0 (also without a driver)."""
    import rrmm

    print(f"rrmm {rrmm.__version__}")
    if not _rrmm.driver_available():
        print(f"CUDA driver: not available ({_rrmm.driver_error()})")
        print("devices: none")
        return 0
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
    return 0
