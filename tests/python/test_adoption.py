"""RMM users' code on rrmm: the user-guide snippets, RRMM_AS_RMM, rrmm._cuda.gpu, messages.

GPU-free: the snippets run on simulated memory where they can; what needs a device checks the
API and the clear error instead (the GPU stage `rmmtests`/`python` runs them for real).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import rrmm
import rrmm as rmm
import rrmm.mr

HAS_GPU = rrmm._rrmm.device_count() > 0


@pytest.fixture
def simulated():
    rmm.mr.set_current_device_resource(rmm.mr.SimulatedMemoryResource("8GiB"))
    yield
    rrmm._rrmm._clear_per_device_resources()


def _run(code: str, alias: bool) -> str:
    """Runs ``code`` in a fresh interpreter (with ``RRMM_AS_RMM=1`` when ``alias``); it must exit
    0. Returns its standard output."""
    env = dict(os.environ)
    env.pop("RRMM_AS_RMM", None)
    if alias:
        env["RRMM_AS_RMM"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# ---------------------------------------------------------------- snippets


def test_upstream_keyword_is_accepted_wherever_upstream_mr_is(simulated):
    base = rmm.mr.SimulatedMemoryResource("8GiB")
    pool = rmm.mr.PoolMemoryResource(
        upstream=base, initial_pool_size=2**30, maximum_pool_size=2**32
    )
    assert pool.upstream_mr is base and pool.pool_size() == 2**30
    assert rmm.mr.StatisticsResourceAdaptor(upstream=base).upstream_mr is base
    assert rmm.mr.LimitingResourceAdaptor(upstream=base, allocation_limit=1024).upstream_mr is base
    assert rmm.mr.FailureCallbackResourceAdaptor(upstream=base, callback=lambda n: False)
    assert rmm.mr.TrackingResourceAdaptor(upstream=base).upstream_mr is base
    assert rmm.mr.BinningMemoryResource(upstream=base).upstream_mr is base
    with pytest.raises(TypeError, match="both"):
        rmm.mr.PoolMemoryResource(base, upstream=base)
    with pytest.raises(TypeError, match="upstream_mr"):
        rmm.mr.PoolMemoryResource()
    with pytest.raises(TypeError, match="allocation_limit"):
        rmm.mr.LimitingResourceAdaptor(base)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-driver error; the GPU run makes real pools")
def test_guide_pool_snippets_fail_only_for_want_of_a_driver():
    for upstream in (rmm.mr.CudaMemoryResource, rmm.mr.ManagedMemoryResource):
        with pytest.raises(RuntimeError, match="driver"):
            rmm.mr.PoolMemoryResource(
                upstream=upstream(), initial_pool_size=2**30, maximum_pool_size=2**32
            )


def test_to_device_takes_bytes_and_any_contiguous_buffer(monkeypatch):
    seen = []

    class Recorder:
        @staticmethod
        def to_device(view, stream=None, mr=None):
            seen.append((view.format, view.ndim, bytes(view)))
            return len(seen)

    monkeypatch.setattr(rrmm, "DeviceBuffer", Recorder)
    a = np.array([1, 2, 3], dtype="float64")
    rmm.to_device(a.tobytes())
    rmm.to_device(a)
    m = np.arange(20, dtype="int32").reshape(4, 5)
    rmm.to_device(m)
    rmm.to_device(np.zeros(0, dtype="complex128"))
    assert seen == [
        ("B", 1, a.tobytes()),
        ("B", 1, a.tobytes()),
        ("B", 1, m.tobytes()),
        ("B", 1, b""),
    ]
    with pytest.raises(ValueError, match="contiguous"):
        rmm.to_device(np.zeros((4, 4))[:, ::2])
    with pytest.raises(TypeError):
        rmm.to_device(123)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (copies to device memory)")
def test_to_device_round_trips_on_a_gpu():
    a = np.array([1, 2, 3], dtype="float64")
    assert bytes(rmm.to_device(a.tobytes())) == a.tobytes()
    assert bytes(rmm.to_device(a)) == a.tobytes()
    assert bytes(rmm.DeviceBuffer.to_device(a.view("int8"))) == a.tobytes()


def test_device_buffer_to_device_keeps_rmms_checks_but_takes_8_bit_types(simulated):
    for ok in (np.zeros(3, dtype="int8"), np.zeros(3, dtype=bool), np.zeros(3, dtype="u1")):
        try:
            rmm.DeviceBuffer.to_device(ok)
        except RuntimeError as error:  # the type passed; simulated memory cannot take a copy
            assert "simulated" in str(error)
    with pytest.raises(ValueError, match="dtype mismatch"):
        rmm.DeviceBuffer.to_device(np.ones(2, "u2"))
    with pytest.raises(ValueError):
        rmm.DeviceBuffer.to_device(np.ones((2, 2), "u1"))


def test_top_level_names_of_older_rmm_releases():
    assert "to_device" in rmm.__all__ and "rmm_cupy_allocator" in rmm.__all__
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError, match="cupy"):
            rmm.rmm_cupy_allocator(256)
    try:
        from numba import cuda  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="numba"):
            rmm.RMMNumbaManager  # noqa: B018
        with pytest.raises(ImportError, match="numba"):
            rmm._numba_memory_manager  # noqa: B018
    else:
        assert rmm.RMMNumbaManager is rrmm.allocators.numba.RMMNumbaManager
        assert rmm._numba_memory_manager is rmm.RMMNumbaManager
    with pytest.raises(AttributeError):
        rmm.no_such_name  # noqa: B018


def test_cupy_allocator_imports_without_cupy():
    out = _run(
        "import sys; sys.modules['cupy'] = None\n"
        "from rrmm.allocators.cupy import rmm_cupy_allocator\n"
        "try:\n    rmm_cupy_allocator(8)\nexcept ModuleNotFoundError as e:\n    print('MNF', e.name)\n",
        alias=False,
    )
    assert out.strip() == "MNF cupy"


def test_experimental_async_managed_resource_is_where_rmm_has_it():
    from rrmm.mr import experimental

    assert rmm.mr.experimental is experimental
    cls = experimental.CudaAsyncManagedMemoryResource
    assert issubclass(cls, rmm.mr.DeviceMemoryResource)
    if not HAS_GPU:
        with pytest.raises(RuntimeError, match="driver"):
            cls()


def test_version_and_git_commit():
    assert isinstance(rmm.__git_commit__, str)
    assert isinstance(rmm.__version__, str) and rmm.__version__


# ---------------------------------------------------------------- rrmm._cuda.gpu


def test_cuda_gpu_module_has_rmms_functions():
    gpu = rmm._cuda.gpu
    for name in (
        "getDevice",
        "setDevice",
        "getDeviceAttribute",
        "getDeviceCount",
        "runtimeGetVersion",
        "driverGetVersion",
        "deviceGetName",
        "getDeviceProperties",
        "CUDARuntimeError",
    ):
        assert callable(getattr(gpu, name)), name
    if HAS_GPU:
        assert gpu.getDeviceCount() >= 1
        assert gpu.driverGetVersion() >= 11000
        assert gpu.getDeviceAttribute(75, gpu.getDevice()) >= 5  # compute capability major
    else:
        assert gpu.driverGetVersion() == 0
        with pytest.raises(gpu.CUDARuntimeError):
            gpu.getDeviceCount()
        with pytest.raises(gpu.CUDARuntimeError, match="driver"):
            gpu.getDeviceAttribute(75, 0)


# ---------------------------------------------------------------- messages RMM's tests match


def test_stream_messages_are_rmms():
    from rrmm.pylibrmm.stream import CudaStreamFlags, Stream

    class V1Stream:
        def __cuda_stream__(self):
            return (1, 2)

    with pytest.raises(NotImplementedError, match="version: '1'"):
        Stream(V1Stream())
    with pytest.raises(ValueError, match="flags may only be specified when obj is None"):
        Stream(rrmm.pylibrmm.stream.DEFAULT_STREAM, flags=CudaStreamFlags.NON_BLOCKING)


@pytest.mark.parametrize(
    ("raised", "caught"),
    [
        (MemoryError, MemoryError),
        (RuntimeError, RuntimeError),
        (Exception, RuntimeError),
        (BaseException, RuntimeError),
        # A Ctrl-C (or an exit) in a callback stays what it is (issue 39).
        (KeyboardInterrupt, KeyboardInterrupt),
        (SystemExit, SystemExit),
    ],
)
def test_callback_errors_reach_python_as_rmm_raises_them(raised, caught):
    base = rmm.mr.SimulatedMemoryResource("1GiB")

    def allocate(size, stream):
        raise raised("My alloc error")

    def deallocate(ptr, size, stream):
        base.deallocate(ptr, size)

    rmm.mr.set_current_device_resource(rmm.mr.CallbackMemoryResource(allocate, deallocate))
    try:
        with pytest.raises(caught, match="My alloc error"):
            rmm.DeviceBuffer(size=256)
    finally:
        rrmm._rrmm._clear_per_device_resources()


# ---------------------------------------------------------------- RRMM_AS_RMM


def test_rrmm_as_rmm_makes_import_rmm_give_rrmm():
    code = (
        "import rmm, rmm.mr, rmm.statistics, rmm.pylibrmm.stream, rmm.allocators.cupy\n"
        "import rmm.mr.experimental, rmm._cuda.gpu, rrmm\n"
        "from rmm.pylibrmm.memory_resource._memory_resource import _flush_logs\n"
        "from rmm.statistics import _get_descriptive_name_of_object\n"
        "assert rmm is rrmm and rmm.mr is rrmm.mr, (rmm, rmm.mr)\n"
        "assert rmm.__spec__.name == 'rrmm', rmm.__spec__\n"
        "assert rmm.mr.PoolMemoryResource is rrmm.mr.PoolMemoryResource\n"
        "try:\n    import rmm.no_such_module\nexcept ModuleNotFoundError as e:\n    print(e)\n"
        "print('ok', rmm.__name__)\n"
    )
    out = _run(code, alias=True)
    assert "rrmm has no 'rrmm.no_such_module'" in out
    assert out.strip().endswith("ok rrmm")


def test_without_the_variable_import_rmm_is_untouched():
    code = (
        "import sys\n"
        "assert not any(type(f).__name__ == 'AliasFinder' for f in sys.meta_path)\n"
        "assert '_rrmm_as_rmm' not in sys.modules and 'rrmm' not in sys.modules\n"
        "try:\n    import rmm\nexcept ImportError:\n    print('no rmm')\nelse:\n"
        "    print('real', rmm.__name__)\n"
    )
    out = _run(code, alias=False)
    assert out.strip() in ("no rmm", "real rmm")


def test_a_real_rmm_already_imported_is_a_clear_error():
    code = (
        "import sys, types\n"
        "fake = types.ModuleType('rmm'); fake.__file__ = '/site/rmm/__init__.py'\n"
        "sys.modules['rmm'] = fake\n"
        "import _rrmm_as_rmm\n"
        "try:\n    _rrmm_as_rmm.install()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = _run(code, alias=False)
    assert "the real rmm is already imported" in out
    assert "/site/rmm/__init__.py" in out


def test_pylibrmm_logger_module_has_rmms_names():
    from rrmm.pylibrmm import logger

    assert logger.level_enum is rrmm.level_enum
    logger.set_logging_level(logger.level_enum.info)
    assert logger.get_logging_level() == logger.level_enum.info
