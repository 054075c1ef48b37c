"""reinitialize and its hooks, the logging API and the module layout, without a GPU."""

from __future__ import annotations

import importlib

import pytest
import rrmm
from rrmm import _rrmm

NO_GPU = not (_rrmm.driver_available() and _rrmm.device_count() > 0)


@pytest.fixture(autouse=True)
def clean_hooks():
    saved = list(rrmm.rmm._reinitialize_hooks)
    rrmm.rmm._reinitialize_hooks.clear()
    yield
    rrmm.rmm._reinitialize_hooks[:] = saved
    _rrmm._clear_per_device_resources()


# Each module and the names it must have.
PUBLIC_NAMES = {
    "rrmm": [
        "DeviceBuffer", "RMMError", "reinitialize", "is_initialized", "register_reinitialize_hook",
        "unregister_reinitialize_hook", "enable_logging", "disable_logging", "get_log_filenames",
        "set_logging_level", "get_logging_level", "set_flush_level", "get_flush_level",
        "flush_logger", "should_log", "level_enum", "mr", "statistics",
    ],
    "rrmm.mr": [],
    "rrmm.statistics": [],
    "rrmm.pylibrmm.stream": [
        "DEFAULT_STREAM", "LEGACY_DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM", "CudaStreamFlags", "Stream",
    ],
    "rrmm.pylibrmm.device_buffer": [
        "DeviceBuffer", "copy_device_to_ptr", "copy_host_to_ptr", "copy_ptr_to_host", "to_device",
    ],
    "rrmm.pylibrmm.cuda_stream_pool": ["CudaStreamPool"],
    "rrmm.pylibrmm.memory_resource": [],
}


def test_public_names():
    for module, names in PUBLIC_NAMES.items():
        imported = importlib.import_module(module)
        for name in names:
            assert hasattr(imported, name), f"{module}.{name}"


def test_rmm_error():
    e = rrmm.RMMError(3, "bad")
    assert e.errcode == 3 and str(e) == "bad"
    import pickle

    e2 = pickle.loads(pickle.dumps(e))
    assert e2.errcode == 3


def test_hooks_run_in_reverse_order_with_arguments():
    order = []

    def first(x, y=0):
        order.append(("first", x, y))

    def second():
        order.append(("second",))

    assert rrmm.register_reinitialize_hook(first, 1, y=2) is first
    rrmm.register_reinitialize_hook(second)
    with pytest.warns(RuntimeWarning) if NO_GPU else _nothing():
        rrmm.reinitialize()
    assert order == [("second",), ("first", 1, 2)]


def test_unregister_removes_every_copy():
    calls = []

    def hook():
        calls.append(1)

    rrmm.register_reinitialize_hook(hook)
    rrmm.register_reinitialize_hook(hook)
    rrmm.unregister_reinitialize_hook(hook)
    with pytest.warns(RuntimeWarning) if NO_GPU else _nothing():
        rrmm.reinitialize()
    assert calls == []
    rrmm.unregister_reinitialize_hook(hook)


@pytest.mark.skipif(not NO_GPU, reason="checks the behaviour without a GPU")
def test_reinitialize_without_gpu_warns_only():
    rrmm.mr.set_current_device_resource(rrmm.mr.SystemMemoryResource())
    for kwargs in [
        {},
        {"pool_allocator": True},
        {"pool_allocator": True, "managed_memory": True, "initial_pool_size": "1GiB"},
        {"devices": [0, 1]},
        {"logging": True, "log_file_name": "x.csv"},
    ]:
        with pytest.warns(RuntimeWarning, match="no CUDA device"):
            rrmm.reinitialize(**kwargs)
        assert not rrmm.is_initialized()


def test_reinitialize_checks_sizes():
    with pytest.raises(ValueError):
        rrmm.reinitialize(pool_allocator=True, initial_pool_size="lots")
    # RMM's test_reinitialize_with_invalid_str_arg_pool_size: "2kb" is a size, "2k" is not (nor
    # "4G", which `rrmm replay --initial-pool-size` refuses the same way).
    for bare in ["2k", "4G"]:
        with pytest.raises(ValueError, match="Could not parse"):
            rrmm.reinitialize(pool_allocator=True, initial_pool_size=bare, maximum_pool_size="8k")
    with pytest.raises(TypeError):
        rrmm.reinitialize(pool_allocator=True, initial_pool_size=1.5)


def test_logging_levels():
    old = rrmm.get_logging_level()
    try:
        rrmm.set_logging_level(rrmm.level_enum.debug)
        assert rrmm.get_logging_level() == rrmm.level_enum.debug
        assert rrmm.should_log(rrmm.level_enum.info)
        assert not rrmm.should_log(rrmm.level_enum.trace)
        rrmm.set_flush_level(rrmm.level_enum.error)
        assert rrmm.get_flush_level() == rrmm.level_enum.error
        rrmm.flush_logger()
        with pytest.raises(TypeError):
            rrmm.set_logging_level("debug")
        with pytest.raises(TypeError):
            rrmm.set_flush_level(3)
        with pytest.raises(TypeError):
            rrmm.should_log(None)
        assert [lvl.name for lvl in rrmm.level_enum] == [
            "trace",
            "debug",
            "info",
            "warn",
            "error",
            "critical",
            "off",
        ]
    finally:
        rrmm.set_logging_level(old)


def test_enable_disable_logging(tmp_path):
    host = rrmm.mr.SystemMemoryResource()
    rrmm.mr.set_current_device_resource(host)
    rrmm.enable_logging(str(tmp_path / "rrmm.csv"))
    logged = rrmm.mr.get_current_device_resource()
    assert isinstance(logged, rrmm.mr.LoggingResourceAdaptor)
    assert rrmm.get_log_filenames() == {0: str(tmp_path / "rrmm.dev0.csv")}
    rrmm.enable_logging(str(tmp_path / "other.csv"))
    assert rrmm.mr.get_current_device_resource() is logged
    b = rrmm.DeviceBuffer(size=10)
    del b
    logged.flush()
    rows = (tmp_path / "rrmm.dev0.csv").read_text().splitlines()
    assert len(rows) == 3
    rrmm.disable_logging()
    assert rrmm.mr.get_current_device_resource() is host
    assert rrmm.get_log_filenames() == {0: None}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_reinitialize_checks_the_ledgers_options_before_anything_changes(monkeypatch):
    """``share_gpu``'s options are checked whole before any resource is replaced: without a GPU
    (keys, types, units, percentages) as with one (sizes against the device)."""
    sim = rrmm.mr.SimulatedMemoryResource("1GiB")
    rrmm.mr.set_per_device_resource(0, sim)
    refused = [
        (TypeError, "unknown option 'bogus'", {"bogus": 1}),
        (TypeError, "not bool", {"soft_share": True}),
        (ValueError, "0% to 100%", {"soft_share": "150%"}),
        (ValueError, "above the hard limit", {"soft_share": "2GiB", "hard_limit": "1GiB"}),
        (ValueError, "cannot name a ledger", {"device_key": ".."}),
        (TypeError, "must be True, False, None or a dict", "yes"),
    ]
    for error, match, share_gpu in refused:
        with pytest.raises(error, match=match):
            rrmm.reinitialize(share_gpu=share_gpu)
        assert rrmm.mr.get_per_device_resource(0) is sim, f"{share_gpu}: nothing replaced"
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "1.5G")
    with pytest.raises(ValueError, match="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        rrmm.reinitialize(share_gpu=True)
    assert rrmm.mr.get_per_device_resource(0) is sim
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "100MB")
    with pytest.raises(ValueError, match="above the hard limit"):
        rrmm.reinitialize(share_gpu={"soft_share": "200MiB"})
    if NO_GPU:
        # Sound options: no device, so a warning and nothing set, as without them.
        with pytest.warns(RuntimeWarning, match="no CUDA device"):
            rrmm.reinitialize(share_gpu={"soft_share": "25%", "name": "w"})
    else:
        # On a GPU the device's size is known: a soft share beyond it is refused first.
        with pytest.raises(ValueError, match="more than the device"):
            rrmm.reinitialize(share_gpu={"soft_share": 1 << 60})
        assert rrmm.mr.get_per_device_resource(0) is sim
