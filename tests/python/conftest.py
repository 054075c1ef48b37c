"""Shared fixtures: CPU tests run against host memory (SystemMemoryResource) set as the current
device's resource, so DeviceBuffer moves real bytes without a GPU."""

from __future__ import annotations

import pytest
import rrmm
from rrmm import _rrmm


def gpu_available() -> bool:
    return _rrmm.driver_available() and _rrmm.device_count() > 0


def gpu_skip_reason() -> str:
    if not _rrmm.driver_available():
        return f"no CUDA driver: {_rrmm.driver_error()}"
    return "no CUDA device"


@pytest.fixture
def system_mr():
    """Makes a SystemMemoryResource the current device's resource for the test."""
    mr = rrmm.mr.SystemMemoryResource()
    rrmm.mr.set_current_device_resource(mr)
    yield mr
    _rrmm._clear_per_device_resources()


@pytest.fixture
def sim_mr():
    """A 1 GiB simulated device (pointers only, no memory)."""
    return rrmm.mr.SimulatedMemoryResource("1GiB")
