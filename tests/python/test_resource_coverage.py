"""Every resource class the package exports (``rrmm.mr`` and ``rrmm.mr.experimental``) is
driven by the conformance suite, the resource fuzzer and the API state machine (or is named,
with the reason, as one those cannot build without a GPU). A new class fails here until the
three know it."""

from __future__ import annotations

import pytest
import rrmm.mr
import rrmm.mr.experimental
import test_api_state_machine as machine
import test_conformance as conformance
import test_resource_fuzz as fuzz


def _exported() -> set[str]:
    out = set()
    for module in (rrmm.mr, rrmm.mr.experimental):
        for name in getattr(module, "__all__", dir(module)):
            obj = getattr(module, name, None)
            if isinstance(obj, type) and issubclass(obj, rrmm.mr.DeviceMemoryResource):
                out.add(name)
    return out


EXPORTED = _exported()
ABSTRACT = {"DeviceMemoryResource", "UpstreamResourceAdaptor"}


def test_the_export_list_is_not_empty() -> None:
    assert {"PoolMemoryResource", "CudaAsyncManagedMemoryResource"} <= EXPORTED


SUITES = {
    "the conformance suite (test_conformance.py)": set(conformance.ADAPTORS)
    | set(conformance.CPU_BASES)
    | set(conformance.GPU_BASES)
    | set(conformance.OWN_SUITES),
    "the resource fuzzer (test_resource_fuzz.py)": set(fuzz.FACTORIES) | set(fuzz.GPU_ONLY),
    "the API state machine (test_api_state_machine.py)": machine.MACHINE_CLASSES
    | set(machine.MACHINE_GPU_ONLY),
}


@pytest.mark.parametrize("suite", list(SUITES))
def test_every_exported_resource_class_is_driven(suite: str) -> None:
    covered = SUITES[suite]
    missing = EXPORTED - ABSTRACT - covered
    assert not missing, f"{suite} misses {sorted(missing)}"
    unknown = covered - EXPORTED
    assert not unknown, f"{suite} names classes the package does not export: {sorted(unknown)}"
