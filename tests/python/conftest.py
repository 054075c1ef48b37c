"""Shared fixtures: CPU tests run against host memory (SystemMemoryResource) set as the current
device's resource, so DeviceBuffer moves real bytes without a GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable

import pytest
import rrmm
from hypothesis import HealthCheck, settings
from rrmm import _rrmm

# Hypothesis budgets for every generated test: ``ci`` (the default) keeps CI's time bounded;
# ``RRMM_HYPOTHESIS=long`` raises the example counts (``RRMM_HYPOTHESIS_EXAMPLES``, default
# 2000 per test) for a long run before a release. The state machine and the CLI fuzzer scale
# their own budgets from the same variable.
settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("RRMM_HYPOTHESIS_EXAMPLES", "2000")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("RRMM_HYPOTHESIS", "ci"))


# Not imported ahead: optional dependencies' modules (numpy, django, ...: tests import their
# own), and modules that build Unicode tables on import (slow, and Hypothesis warns of it).
_HYPOTHESIS_NOT_PREIMPORTED = (
    "hypothesis.extra",
    "hypothesis.provisional",
    "hypothesis.strategies._internal.regex",
)


def _import_hypothesis_lazy_modules() -> None:
    """Imports every Hypothesis module it would otherwise import lazily, during a test.

    CPython 3.11's ``ast.parse`` keeps its depth count in per-interpreter state, so a parse
    nested in another makes the outer one fail with ``SystemError: AST constructor recursion
    depth mismatch`` (fixed in 3.12). pytest parses every module of a plugin's package when it is
    first imported (to rewrite its asserts); if the garbage collector runs during that parse and
    frees a buffer through a test's callback whose free raises (the state machine's misbehaving
    callbacks do, on purpose), ``sys.unraisablehook`` formats the traceback, and 3.11's traceback
    module parses the failing line: a nested parse. It failed CI once, importing
    ``hypothesis.internal.conjecture.optimiser`` mid-test. Imported here, before any test, no
    plugin module is parsed while tests run."""
    if sys.version_info >= (3, 12):
        return
    import pkgutil

    import hypothesis

    for module in pkgutil.walk_packages(hypothesis.__path__, "hypothesis."):
        if module.name.startswith(_HYPOTHESIS_NOT_PREIMPORTED) or module.name in sys.modules:
            continue
        try:
            __import__(module.name)
        except ImportError:
            pass  # a module for an optional dependency not installed (attrs, say)


_import_hypothesis_lazy_modules()

from hypothesis import strategies as _st

#: Any JSON value, small: what a hostile or corrupt file may hold where a figure is expected.
JSON_VALUES = _st.recursive(
    _st.one_of(_st.none(), _st.booleans(), _st.integers(-(2**70), 2**70),
               _st.floats(allow_nan=True, allow_infinity=True), _st.text(max_size=6)),
    lambda inner: _st.one_of(_st.lists(inner, max_size=3),
                             _st.dictionaries(_st.text(max_size=4), inner, max_size=3)),
    max_leaves=8,
)


def snapshot_view(*argv: str) -> tuple[int, str, str]:
    """``rrmm snapshot view ARGV`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from rrmm.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["snapshot", "view", *argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def gpu_available() -> bool:
    return _rrmm.driver_available() and _rrmm.device_count() > 0


def gpu_skip_reason() -> str:
    if not _rrmm.driver_available():
        return f"no CUDA driver: {_rrmm.driver_error()}"
    return "no CUDA device"


def skip_module_without_gpu() -> None:
    """Skips the calling test module, with the reason, where there is no CUDA driver or device."""
    if not gpu_available():
        pytest.skip(gpu_skip_reason(), allow_module_level=True)


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


# ---------------------------------------------------------------------------------------------
# Running code in a child interpreter: a crash (signal) or a deadlock fails one test, not the run.

#: Put before every child's code: the imports and the `expect` helper the snippets use.
CHILD_PRELUDE = '''
import re, sys, time, threading
import rrmm, rrmm.mr as mr
from rrmm import _rrmm
from rrmm.pylibrmm.device_buffer import (
    DeviceBuffer, copy_device_to_ptr, copy_host_to_ptr, copy_ptr_to_host, to_device,
)

def expect(exc_type, pattern, fn):
    """Calls fn(); it must raise exactly exc_type (not a subclass) with a message matching
    pattern; returns the exception."""
    try:
        fn()
    except BaseException as e:
        assert type(e) is exc_type, f"raised {type(e).__name__}: {e} (wanted {exc_type.__name__})"
        assert re.search(pattern, str(e)), f"message {str(e)!r} does not match {pattern!r}"
        return e
    raise AssertionError(f"no exception (wanted {exc_type.__name__} matching {pattern!r})")
'''


def run_in_child(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs ``CHILD_PRELUDE + code`` in a fresh interpreter and fails the calling test (with the
    child's output) when the child dies of a signal, times out (a deadlock) or exits non-zero.
    The code must print ``CHILD OK`` as its last act."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child did not finish in {timeout} s (deadlock?); stderr: {e.stderr!r}")
    tail = f"\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    if proc.returncode < 0:
        pytest.fail(f"the child crashed: {signal.Signals(-proc.returncode).name}{tail}")
    if proc.returncode != 0:
        pytest.fail(f"the child failed (exit status {proc.returncode}){tail}")
    if "CHILD OK" not in proc.stdout:
        pytest.fail(f"the child did not reach its end{tail}")
    return proc


def run_fresh(code: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs ``code`` (dedented, without ``CHILD_PRELUDE``) in a fresh interpreter, with this
    process's environment and ``env``; returns its standard output and fails the calling test
    (with both outputs) on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# The helpers of the framework hooks' child scripts (test_hooks_*.py).
HOOK_HELPERS = """
def rrmm_mr(*names):
    import rrmm.mr as mr
    for n in ("CudaMemoryResource", "set_current_device_resource") + names:
        getattr(mr, n)  # a missing class fails the test
    return mr

def count(stats, key):
    c = stats.allocation_counts
    return c[key] if isinstance(c, dict) else getattr(c, key)
"""


@pytest.fixture
def child():
    """``child(code, timeout=60)``: see ``run_in_child``."""
    return run_in_child


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """Runs ``work(t)`` on ``count`` threads and re-raises the first failure."""
    errors: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            work(t)
        except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
