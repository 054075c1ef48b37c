"""Device queries as RMM's ``rmm._cuda.gpu`` names them, over rrmm's driver layer (no
cuda-python needed).

rrmm has no CUDA runtime: ``runtimeGetVersion`` is the driver's CUDA version, the runtime rrmm
effectively uses; device numbers are the driver's ordinals; ``getDevice``/``setDevice`` work on
the calling thread's current context as ``cudaGetDevice``/``cudaSetDevice`` do.
"""

from __future__ import annotations

from typing import Any, SupportsInt

from rrmm import _rrmm

__all__ = [
    "CUDADriverError",
    "CUDARuntimeError",
    "deviceGetName",
    "driverGetVersion",
    "getDevice",
    "getDeviceAttribute",
    "getDeviceCount",
    "getDeviceProperties",
    "runtimeGetVersion",
    "setDevice",
]


class CUDARuntimeError(RuntimeError):
    """A failed device query (RMM raises it for a failed runtime call)."""


class CUDADriverError(RuntimeError):
    """A failed driver call."""


def _call(function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except (RuntimeError, OSError) as error:
        raise CUDARuntimeError(str(error)) from error


def driverGetVersion() -> int:
    """The CUDA version the driver supports, ``1000 * major + 10 * minor``; 0 without a driver."""
    if _rrmm.driver_error() is not None:
        return 0
    return int(_call(_rrmm.driver_version))


def runtimeGetVersion() -> int:
    """The CUDA version rrmm runs on: the driver's (rrmm calls the driver API directly)."""
    return int(_call(_rrmm.driver_version))


def getDeviceCount() -> int:
    """The number of CUDA devices."""
    if _rrmm.driver_error() is not None:
        raise CUDARuntimeError(f"cudaErrorNoDevice: {_rrmm.driver_error()}")
    return int(_rrmm.device_count())


def getDevice() -> int:
    """The calling thread's current device."""
    return int(_call(_rrmm._current_device))


def setDevice(device: int) -> None:
    """Makes ``device``'s primary context current on the calling thread."""
    _call(_rrmm._set_device, int(device))


def getDeviceAttribute(attr: SupportsInt, device: int) -> int:
    """The value of ``attr`` (a ``cudaDeviceAttr`` or its int value) for ``device``."""
    return int(_call(_rrmm._device_attribute, int(attr), int(device)))


def deviceGetName(device: int) -> str:
    """The name of ``device``."""
    try:
        return str(_rrmm.device_name(int(device)))
    except (RuntimeError, OSError) as error:
        raise CUDADriverError(str(error)) from error


def getDeviceProperties(device: int) -> dict[str, Any]:
    """A few of ``cudaGetDeviceProperties``' fields, as a dict (RMM returns cuda-python's
    ``cudaDeviceProp``): ``name``, ``totalGlobalMem``, ``major``, ``minor``,
    ``multiProcessorCount``."""
    free_total = _call(_rrmm.device_memory_info, int(device))
    return {
        "name": deviceGetName(device),
        "totalGlobalMem": int(free_total[1]),
        "major": getDeviceAttribute(75, device),
        "minor": getDeviceAttribute(76, device),
        "multiProcessorCount": getDeviceAttribute(16, device),
    }
