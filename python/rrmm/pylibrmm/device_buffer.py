"""Device buffers and pointer copies (RMM's ``rmm.pylibrmm.device_buffer``)."""

import inspect

from rrmm._rrmm import DEFAULT_STREAM as _DEFAULT_STREAM
from rrmm._rrmm import (
    DeviceBuffer,
    copy_device_to_ptr,
    copy_host_to_ptr,
    copy_ptr_to_host,
    to_device,
)

__all__ = [
    "DeviceBuffer",
    "copy_device_to_ptr",
    "copy_host_to_ptr",
    "copy_ptr_to_host",
    "to_device",
]


def _with_default_stream(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with its ``stream`` default shown as the object it is, ``DEFAULT_STREAM``:
    a compiled signature can spell only literal defaults (``inspect`` refuses a text signature
    naming an object), and PyO3 writes ``...`` for it."""
    return signature.replace(parameters=[
        p.replace(default=_DEFAULT_STREAM) if p.name == "stream" and p.default is Ellipsis else p
        for p in signature.parameters.values()
    ])


# ``help(DeviceBuffer)`` and ``inspect.signature``: the constructor's real defaults.
DeviceBuffer.__signature__ = _with_default_stream(inspect.signature(DeviceBuffer))
del inspect
