"""rrmm on Dask clusters. Needs ``distributed`` (``pip install distributed``; from a checkout of
rrmm, ``pip install '.[dask]'`` installs it: the ``dask`` extra of pyproject.toml).

- ``RRMMSetup``: a ``distributed.WorkerPlugin`` taking dask-cuda's RMM options (with dask-cuda's
  validation and messages) plus ``simulate="80GiB"`` for simulated memory (CPU-only clusters,
  dry runs, tests). ``client.register_plugin(RRMMSetup(...))`` sets up every worker, including
  workers that join later.
- A preload module: ``dask worker --preload rrmm.dask`` reads the same options from the ``rrmm``
  section of Dask's config (``rrmm: {initial-pool-size: 4GiB, simulate: ...}``).
- Worker metrics ``rmm-used`` / ``rmm-total`` (distributed's dashboard page reads them),
  ``dask.sizeof`` and distributed's cuda/dask serializers for ``rrmm.DeviceBuffer``.
- ``share_arrays=True``: arrays go between workers of one GPU by attaching, not copying
  (``rrmm._dask_share``; docs/sharing.md, "Dask").
- ``memory_report(client)``: per worker, bytes in use now and at peak, footprint,
  fragmentation, largest free block and failed allocations, and the GPU ledger's view of the
  worker where it joined one (``share_gpu``); printable, and ``.rows`` for scripts.

Importing this module registers the sizeof and serializers, and the ``rrmm-share``
serialization family (needs ``distributed``).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: What to run when ``distributed`` is missing (the ``dask`` extra of pyproject.toml).
INSTALL_HINT = "pip install distributed (from a checkout of rrmm: pip install '.[dask]')"

try:
    import dask
    import dask.sizeof
    from distributed import WorkerPlugin
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.protocol.serialize import dask_deserialize, dask_serialize
except ImportError as _cause:  # pragma: no cover - depends on the environment
    raise ImportError(f"rrmm.dask needs Dask's distributed, which could not be imported "
                      f"({_cause}): {INSTALL_HINT}", name=getattr(_cause, "name", None)
                      ) from _cause

import rrmm
import rrmm._stack
import rrmm.mr
import rrmm.shared_gpu
from rrmm import _dask_share
from rrmm.allocators import FRAMEWORKS, use_rrmm_for
from rrmm.rmm import stack_kind
from rrmm.shared_gpu import ProcessRow

_dask_share.register()

__all__ = [
    "MemoryReport",
    "MemoryRow",
    "RRMMSetup",
    "dask_setup",
    "memory_report",
    "options_from_config",
    "worker_figures",
]

_ALIGNMENT = 256
_log = logging.getLogger("rrmm.dask")


# ---------------------------------------------------------------- sizes and validation


def _device_total(simulate: int | None) -> int:
    if simulate is not None:
        return simulate
    return int(rrmm._rrmm.device_memory_info(rrmm._rrmm._current_device())[1])


def parse_device_bytes(value: Any, total: int | None = None, alignment: int = _ALIGNMENT,
                       name: str = "size") -> int | None:
    """dask-cuda's ``parse_device_bytes``: None, 0 and "0 B" give None; a float in (0, 1] is a
    fraction of the device's memory (``total``, the simulated size when simulating); an int or
    a string is read by the package's one size reader (RMM's grammar: ``"4GiB"``, ``"5GB"``,
    ``"512 MiB"``; a bare unit such as ``"4G"`` is refused, where dask's ``parse_bytes`` would
    read 4 * 10**9; at most 2**64 - 1 bytes), each refusal naming ``name`` and the value; the
    result is rounded down to ``alignment``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: a memory size must be int, float or str, not {value!r}")
    if isinstance(value, float):
        if value == 0:
            return None
        if not 0 < value <= 1:
            raise ValueError(f"{name}: a fraction of device memory must be in (0, 1], "
                             f"not {value}")
        if total is None:
            raise ValueError(f"{name}={value}: a fraction of device memory needs a device")
        size = int(total * value)
    elif isinstance(value, (int, str)):
        try:
            size = rrmm._rrmm._read_size(value, name)
        except OverflowError as error:  # negative or past 2**64 - 1: a bad value all the same
            raise ValueError(str(error)) from None
    else:
        raise TypeError(f"{name}: a memory size must be int, float or str, not "
                        f"{type(value).__name__} {value!r}")
    size -= size % alignment
    return size or None


def _check_size(value: Any, name: str) -> int | None:
    """Validates a size option at construction: its bytes (rounded down to 256), None where
    not given or a fraction of the device (checked on the worker, which knows its size)."""
    if value is None or isinstance(value, float) and 0 <= value <= 1:
        return None
    try:
        return parse_device_bytes(value, total=None, name=name)
    except (TypeError, ValueError) as error:
        raise ValueError(f"`{name}`: {error}") from error


def _check_initial_below_maximum(initial: Any, maximum: Any, simulate: int | None) -> None:
    """At construction, where both sizes are known without a device (absolute sizes, two
    fractions, or any sizes on a simulated device): the pool's own rule, initial <= maximum."""
    if initial is None or maximum is None:
        return
    fraction = (isinstance(initial, float), isinstance(maximum, float))
    if fraction == (True, True):
        low, high = float(initial), float(maximum)
    elif fraction == (False, False) or simulate is not None:
        low_size = parse_device_bytes(initial, simulate)
        high_size = parse_device_bytes(maximum, simulate)
        if low_size is None or high_size is None:
            return
        low, high = float(low_size), float(high_size)
    else:
        return  # a fraction against a size: known on the worker, from its device
    if low > high:
        raise ValueError(
            "`rmm_pool_size` must not exceed `rmm_maximum_pool_size` "
            f"({initial!r} > {maximum!r}): Initial pool size exceeds the maximum pool size!"
        )


def _check_plan(allocator: str | None, async_alloc: bool, managed_memory: bool,
                simulate: int | None, sizes: dict[str, int | None]) -> None:
    """The worker's stack checked whole by the one builder's plan (``rrmm._stack``), as far as
    it is known without the worker's device (sizes given as fractions are the worker's to
    check): the sizes of simulated memory, RMM's pool size rules. A ValueError names the
    option."""
    initial, maximum = sizes["rmm_pool_size"], sizes["rmm_maximum_pool_size"]
    if allocator is not None:
        kind = stack_kind(allocator, managed_memory)
    elif async_alloc:
        kind = "cuda_async"
    else:
        kind = stack_kind(initial is not None, managed_memory)
    try:
        rrmm._rrmm._check_stack(kind, simulate=simulate, initial_pool_size=initial,
                                maximum_pool_size=None if async_alloc else maximum)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"RRMMSetup: {error}") from error


def _lib_list(libraries: Any) -> list[str] | None:
    """dask-cuda's handling of ``rmm_allocator_external_lib_list``."""
    if libraries is None:
        return None
    if isinstance(libraries, str):
        libraries = [v.strip() for v in libraries.split(",") if v.strip()]
    elif not isinstance(libraries, list):
        raise ValueError(  # noqa: TRY004 (dask-cuda's exception type)
            "rmm_allocator_external_lib_list must be either a comma-separated "
            "string or a list of strings. Examples: 'torch,cupy' "
            "or ['torch', 'cupy']"
        )
    for lib in libraries:
        if lib not in FRAMEWORKS:
            raise ValueError(
                f"The library '{lib}' is not supported for RMM integration. "
                f"Supported libraries are: {', '.join(FRAMEWORKS)}."
            )
    return libraries


#: What ``share_gpu`` may hold as a dict: ``rrmm.shared_gpu.join``'s keyword options.
_JOIN_OPTIONS = tuple(
    name for name, p in inspect.signature(rrmm.shared_gpu.join).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)


def _share_gpu(share_gpu: Any) -> dict[str, Any] | None:
    """``share_gpu`` checked: None for False, the join options (a copy) for True or a dict."""
    if share_gpu is False:
        return None
    if share_gpu is True:
        return {}
    if not isinstance(share_gpu, dict):
        raise TypeError(
            f"`share_gpu` must be True, False or a dict of rrmm.shared_gpu.join's options, "
            f"not {share_gpu!r}"
        )
    unknown = sorted(str(k) for k in share_gpu if k not in _JOIN_OPTIONS)
    if unknown:
        raise ValueError(
            f"`share_gpu`: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"rrmm.shared_gpu.join takes {', '.join(_JOIN_OPTIONS)}"
        )
    for option in ("soft_share", "hard_limit"):
        _check_share_size(share_gpu.get(option), option)
    for option in ("name", "device_key"):
        value = share_gpu.get(option)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"`share_gpu`: {option} must be a str, not {value!r}")
    directory = share_gpu.get("directory")
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"`share_gpu`: directory must be a path, not {directory!r}")
    # The ledger's own checks (a device key that cannot name a ledger, a soft share above the
    # hard limit in bytes), as rrmm.shared_gpu.join makes them; the directory is the worker's
    # (it may not exist where the plugin is made).
    here = {k: v for k, v in share_gpu.items() if k != "directory"}
    try:
        rrmm._rrmm._shared_gpu_check_options(here, [])
    except (TypeError, ValueError) as error:
        raise type(error)(f"`share_gpu`: {error}") from error
    return dict(share_gpu)


def _check_share_size(value: Any, option: str) -> None:
    """A ``soft_share`` or ``hard_limit`` at construction: bytes, a size string or a
    percentage of the device (its size is known on the worker)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"`share_gpu`: {option} must be bytes, a size string or a percentage, not {value!r}"
        )
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"`share_gpu`: {option} must be >= 0 bytes, not {value}")
        return
    text = value.strip()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0.0 <= percent <= 100.0:
                raise ValueError("a percentage of the device is 0% to 100%")
        else:
            rrmm.parse_bytes(text)
    except ValueError as error:
        raise ValueError(f"`share_gpu`: {option}={value!r}: {error}") from None


def _idle_after(idle_after: Any, shared: bool) -> float | None:
    """``idle_after`` checked: None, or seconds (a finite number >= 0) with ``share_gpu``."""
    if idle_after is None:
        return None
    if isinstance(idle_after, bool) or not isinstance(idle_after, (int, float)):
        raise TypeError(f"`idle_after` must be a number of seconds or None, not {idle_after!r}")
    if not math.isfinite(idle_after) or idle_after < 0:
        raise ValueError(f"`idle_after` must be a finite number of seconds >= 0, not {idle_after!r}")
    if not shared:
        raise ValueError(
            "`idle_after` declares the worker idle in its GPU's ledger, which it joins with "
            "`share_gpu`: pass share_gpu=True (or a dict of options) too"
        )
    return float(idle_after)


def _share_arrays(share_arrays: Any, allocator: str | None, managed_memory: bool,
                  async_alloc: bool, simulate: int | None) -> bool:
    """``share_arrays`` checked: only the expandable pool's pages can be exported."""
    if not isinstance(share_arrays, bool):
        raise TypeError(f"`share_arrays` must be True or False, not {share_arrays!r}")
    if not share_arrays:
        return False
    why = None
    if managed_memory:
        why = "`rmm_managed_memory=True`: managed memory cannot be exported; drop it"
    elif async_alloc:
        why = "`rmm_async=True`: the driver's pool is not rrmm's to export; drop it"
    elif simulate is not None:
        why = (f"`simulate={simulate}`: simulated memory has no bytes to share; "
               "drop one of them")
    elif allocator is None or stack_kind(allocator, False) != "expandable":
        why = (f"`allocator={allocator!r}`: only the expandable pool's pages can be exported; "
               "pass allocator='expandable'")
    if why is not None:
        raise ValueError(f"`share_arrays=True` cannot be used with {why}")
    return True


def _shareable_stack(options: dict[str, Any], log_file: str | None, tracking: bool,
                     extra: dict[str, Any]) -> Any:
    """The expandable kind's stack (its layers in the builder's order: logging, statistics,
    tracking) over a shareable pool, which the builder does not make."""
    mr: Any = rrmm.mr.ExpandableMemoryResource(
        initial_pool_size=options.get("initial_pool_size"),
        maximum_pool_size=options.get("maximum_pool_size"),
        shareable=True,
        **extra,
    )
    if log_file is not None:
        mr = rrmm.mr.LoggingResourceAdaptor(mr, log_file)
    mr = rrmm.mr.StatisticsResourceAdaptor(mr)
    if tracking:
        mr = rrmm.mr.TrackingResourceAdaptor(mr)
    return mr


#: Task states in which a task runs on a worker's thread (``cancelled`` and ``resumed``
#: only for a task that was running: its thread goes on).
_RUNNING = ("executing", "long-running")
_STILL_RUNNING = ("cancelled", "resumed")


# ---------------------------------------------------------------- the worker's state


@dataclass
class _State:
    """What the plugin set up in this process (read by the metrics and the report)."""

    resource: Any = None
    statistics: Any = None
    pool: Any = None
    failed: int = 0
    log_file: str | None = None
    description: str = ""


_state = _State()
_state_lock = threading.Lock()


def _count_failure(nbytes: int) -> bool:
    with _state_lock:
        _state.failed += 1
    return False  # do not retry: the allocation fails as it would without the adaptor


def _find(mr: Any, cls: Any) -> Any:
    """The first resource of type ``cls`` in ``mr``'s upstream chain, or None."""
    seen = 0
    while mr is not None and seen < 64:
        if isinstance(mr, cls):
            return mr
        mr = getattr(mr, "upstream_mr", None)
        seen += 1
    return None


def _worker_name(worker: Any) -> str:
    name = getattr(worker, "name", None)
    if name is None:
        return "scheduler" if worker is None else str(os.getpid())
    return name.split("/")[-1] if isinstance(name, str) else str(name)


class _IdleTimer:
    """A worker's running tasks (their boundaries: spilled data moves back) and its idle
    declarations (``idle_after``): the pending call that declares it idle. Transitions and the
    call run on the worker's event loop."""

    delay: float | None
    mr: Any
    loop: Any
    handle: Any
    running: set[Any]
    declared_idle: bool

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self._reset()

    def _reset(self) -> None:
        self.mr = self.loop = self.handle = None
        self.running = set()
        self.declared_idle = False

    def __getstate__(self) -> dict[str, Any]:
        # The plugin travels pickled to each worker: the delay goes, never a loop or a timer.
        return {"delay": self.delay}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.delay = state["delay"]
        self._reset()

    def start(self, mr: Any, worker: Any) -> None:
        """Tracks ``worker``'s tasks for ``mr``'s ledger; nothing runs yet: idle after the
        delay."""
        if self.delay is None:
            return
        loop = getattr(worker, "loop", None)
        loop = getattr(loop, "asyncio_loop", loop)  # a tornado IOLoop wraps an asyncio loop
        if loop is None or not callable(getattr(loop, "call_later", None)):
            raise RuntimeError(
                "`idle_after` needs a Dask worker with an event loop (worker.loop)"
            )
        self.mr, self.loop = mr, loop
        self._wake_for_transfers(worker)
        self._schedule()

    def _wake_for_transfers(self, worker: Any) -> None:
        """Another worker fetching data from this one (``get_data``) reads its memory outside
        rrmm: the worker is busy first (a pool the ledger put to sleep wakes), idle again after
        the delay."""
        _dask_share.before_get_data(worker, "_rrmm_wakes", lambda _kwargs: self.touch())

    def touch(self) -> None:
        """Busy now (waking what slept), idle again after the delay unless a task runs."""
        if self.mr is None:
            return
        self._cancel()
        if self.declared_idle:
            self.declared_idle = False
            if rrmm.shared_gpu.joined(self.mr):
                rrmm.shared_gpu.declare_busy(self.mr)
        if not self.running:
            self._schedule()

    def stop(self) -> None:
        """Cancels the pending idle declaration; tracks nothing more."""
        self._cancel()
        self._reset()

    def transition(self, key: Any, start: str, finish: str) -> bool:
        """Tracks the running tasks (with or without ``idle_after``); with it, busy as one
        starts and idle ``delay`` after the last stops. Whether the last running task just
        stopped (a task boundary)."""
        if finish in _RUNNING:
            self.running.add(key)
            if self.mr is not None:
                self._cancel()
                if self.declared_idle:
                    self.declared_idle = False
                    if rrmm.shared_gpu.joined(self.mr):
                        rrmm.shared_gpu.declare_busy(self.mr)
            return False
        if key in self.running and finish not in _STILL_RUNNING:
            self.running.discard(key)
            if not self.running:
                if self.mr is not None:
                    self._schedule()
                return True
        return False

    def _schedule(self) -> None:
        self._cancel()
        if not self.declared_idle:
            self.handle = self.loop.call_later(self.delay, self._declare_idle)

    def _cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _declare_idle(self) -> None:
        self.handle = None
        if self.mr is None or self.running or self.declared_idle:
            return
        if not rrmm.shared_gpu.joined(self.mr):
            _log.info("rrmm: the worker left its GPU's ledger; not declaring it idle")
            return
        rrmm.shared_gpu.declare_idle(self.mr)
        self.declared_idle = True


# ---------------------------------------------------------------- the plugin


class RRMMSetup(WorkerPlugin):
    """Sets up rrmm in each worker, with dask-cuda's RMM options.

    ``initial_pool_size``/``maximum_pool_size`` (bytes, strings such as ``"4GiB"`` or fractions
    of the device's memory) make a ``PoolMemoryResource``; ``managed_memory`` puts it (or the
    plain resource) on managed memory; ``async_alloc`` uses ``CudaAsyncMemoryResource``
    (``release_threshold``; ``maximum_pool_size`` then a ``LimitingResourceAdaptor``);
    ``log_directory`` logs to ``rmm_log_<worker-name>.txt`` there (the logging adaptor
    inserts the device, ``.dev0``, before the extension, as RMM's does under dask-cuda); ``track_allocations`` adds a
    ``TrackingResourceAdaptor``; ``external_lib_list`` (``"cupy"``, ``"torch"``) points those
    libraries' allocators at rrmm. ``simulate`` (a size) builds all of it on a
    ``SimulatedMemoryResource`` of that size instead of the GPU (nothing may touch the memory).

    Every worker also gets a ``StatisticsResourceAdaptor`` (for ``rmm-used`` and the peak) and a
    failure counter. Bad options raise ValueError here, before anything is registered.

    ``share_gpu`` (True or a dict of ``rrmm.shared_gpu.join``'s options) joins the GPU's ledger
    under the worker's name; ``idle_after`` (seconds, with ``share_gpu``) declares the worker
    idle that long after its last task. ``share_arrays=True`` (with ``allocator="expandable"``;
    not with ``managed_memory``, ``rmm_async`` or ``simulate``) builds the pool shareable and
    publishes it under a name derived from the worker's address: a CuPy array fetched by
    another worker with ``share_arrays`` on the same GPU is then attached there, not copied
    (the receiver builds it over the sender's memory; the sender's free of it waits until the
    receiver drops it); arrays outside the pool, other objects and workers elsewhere go by
    Dask's usual serializers. Use it with ``external_lib_list="cupy"`` so that CuPy's arrays
    are the pool's. docs/sharing.md, "Dask", says what it does and does not do.
    """

    name = "rrmm-setup"
    idempotent = False

    def __init__(
        self,
        initial_pool_size: Any = None,
        maximum_pool_size: Any = None,
        managed_memory: bool = False,
        async_alloc: bool = False,
        release_threshold: Any = None,
        log_directory: str | None = None,
        track_allocations: bool = False,
        external_lib_list: Any = None,
        simulate: Any = None,
        allocator: str | None = None,
        share_gpu: bool | dict[str, Any] = False,
        idle_after: float | None = None,
        share_arrays: bool = False,
    ) -> None:
        if async_alloc is True and managed_memory is True:
            raise ValueError("`rmm_managed_memory` is incompatible with the `rmm_async`.")
        if async_alloc is False and release_threshold is not None:
            raise ValueError("`rmm_release_threshold` requires `rmm_async`.")
        if initial_pool_size is None and maximum_pool_size is not None and not async_alloc:
            raise ValueError(
                "`rmm_maximum_pool_size` was specified without specifying "
                "`rmm_pool_size`.`rmm_pool_size` must be specified to use RMM pool."
            )
        sizes = {
            option: _check_size(value, option)
            for value, option in (
                (initial_pool_size, "rmm_pool_size"),
                (maximum_pool_size, "rmm_maximum_pool_size"),
                (release_threshold, "rmm_release_threshold"),
            )
        }
        for flag, option in (
            (managed_memory, "rmm_managed_memory"),
            (async_alloc, "rmm_async"),
            (track_allocations, "rmm_track_allocations"),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"`{option}` must be True or False, not {flag!r}")
        if log_directory is not None and not isinstance(log_directory, (str, os.PathLike)):
            raise TypeError(f"`rmm_log_directory` must be a path, not {log_directory!r}")
        self.simulate = None
        if simulate is not None:
            try:
                self.simulate = parse_device_bytes(simulate, alignment=1, name="simulate")
            except (TypeError, ValueError) as error:
                raise ValueError(f"`simulate`: {error}") from error
            if self.simulate is None:
                raise ValueError(f"`simulate` must be a positive size, such as '80GiB', "
                                 f"not {simulate!r}")
        _check_initial_below_maximum(initial_pool_size, maximum_pool_size, self.simulate)
        self.share_arrays = _share_arrays(share_arrays, allocator, bool(managed_memory),
                                          bool(async_alloc), self.simulate)
        if allocator is not None:
            if async_alloc:
                raise ValueError("`allocator` and `rmm_async` choose the resource both")
            stack_kind(allocator, bool(managed_memory))  # ValueError for an unknown kind
        _check_plan(allocator, bool(async_alloc), bool(managed_memory), self.simulate, sizes)
        self.allocator = allocator
        self.initial_pool_size = initial_pool_size
        self.maximum_pool_size = maximum_pool_size
        self.managed_memory = bool(managed_memory)
        self.async_alloc = bool(async_alloc)
        self.release_threshold = release_threshold
        self.log_directory = log_directory
        self.track_allocations = bool(track_allocations)
        self.external_lib_list = _lib_list(external_lib_list)
        self.share_gpu = _share_gpu(share_gpu)
        self.idle_after = _idle_after(idle_after, self.share_gpu is not None)
        #: Extra options of the shareable pool (tests: ``pageable_host``, ``device_capacity``
        #: and ``page_size``, the CPU stand-in); travels with the plugin.
        self._share_pool_options: dict[str, Any] = {}
        self._idle = _IdleTimer(self.idle_after)

    def setup(self, worker: Any = None) -> None:
        """Builds the resource and makes it the current device's; adds the worker metrics."""
        kind, options = self.stack_options()
        log_file = None
        if self.log_directory is not None:
            os.makedirs(self.log_directory, exist_ok=True)
            log_file = os.path.join(self.log_directory, f"rmm_log_{_worker_name(worker)}.txt")
        if self.share_arrays:
            top = _shareable_stack(options, log_file, self.track_allocations,
                                   self._share_pool_options)
        else:
            top = rrmm._stack.build(
                kind,
                simulate=self.simulate,
                logging=log_file is not None,
                log_file=log_file,
                statistics=True,
                tracking=self.track_allocations,
                **options,
            )
        statistics = _find(top, rrmm.mr.StatisticsResourceAdaptor)
        pool = _find(top, rrmm.mr.PoolMemoryResource)
        mr = rrmm.mr.FailureCallbackResourceAdaptor(top, _count_failure)
        rrmm.mr.set_current_device_resource(mr)
        description = _describe(kind, self.simulate)
        with _state_lock:
            _state.resource, _state.statistics, _state.pool = mr, statistics, pool
            _state.failed, _state.log_file, _state.description = 0, log_file, description
        if worker is not None and hasattr(worker, "metrics"):
            worker.metrics["rmm"] = _rmm_metric
        for lib in self.external_lib_list or ():
            use_rrmm_for(lib)
        if self.share_arrays:
            pool = _find(top, rrmm.mr.ExpandableMemoryResource)
            host = self._share_pool_options.get("pageable_host") or \
                self._share_pool_options.get("pinned_host")
            address = getattr(worker, "address", None) or f"pid-{os.getpid()}"
            _dask_share.start(pool, str(address), None if host else rrmm._rrmm._current_device())
            if worker is not None:
                _dask_share.wrap_get_data(worker)
        if self.share_gpu is not None:
            options = {"name": _worker_name(worker), **self.share_gpu}
            rrmm.shared_gpu.join(mr, **options)
            self._idle.stop()
            self._idle.start(mr, worker)

    def teardown(self, worker: Any = None) -> None:
        """Flushes the log, if any; leaves the GPU's ledger where ``share_gpu`` joined it."""
        self._idle.stop()
        if self.share_arrays:
            _dask_share.stop()
        if self.share_gpu is not None and _state.resource is not None:
            rrmm.shared_gpu.leave(_state.resource)
        log = _find(_state.resource, rrmm.mr.LoggingResourceAdaptor)
        if log is not None:
            log.flush()

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """With ``idle_after``: busy when a task starts executing; idle ``idle_after`` seconds
        after the last one running stops, unless another starts meanwhile. Whenever no task
        runs (a task boundary: a safe point, ``rrmm.at_rest``), data that spilled to host pages
        moves back to the device where it has room."""
        if self._idle.transition(key, start, finish) and _state.resource is not None:
            try:
                _state.resource.at_rest()
            except Exception as e:  # noqa: BLE001 (the data stays on the host; the worker runs on)
                _log.warning("rrmm: moving spilled data back between tasks failed: %s", e)

    def stack_options(self) -> tuple[str, dict[str, Any]]:
        """The stack kind and its options (``rrmm._stack.build``) for this worker: dask-cuda's
        meaning of the options (a pool when ``rmm_pool_size`` is given, on managed memory with
        ``rmm_managed_memory``; ``rmm_async``: ``cuda_async``, with ``rmm_maximum_pool_size`` a
        limit), or rrmm's ``allocator`` kind with the same sizes."""
        stand_in = self._share_pool_options.get("device_capacity")  # the CPU stand-in
        total = _device_total(self.simulate) if stand_in is None else rrmm.parse_bytes(stand_in)
        initial = parse_device_bytes(self.initial_pool_size, total, name="rmm_pool_size")
        maximum = parse_device_bytes(self.maximum_pool_size, total,
                                     name="rmm_maximum_pool_size")
        if self.allocator is not None:
            kind = stack_kind(self.allocator, self.managed_memory)
        elif self.async_alloc:
            threshold = parse_device_bytes(self.release_threshold, total,
                                           name="rmm_release_threshold")
            return "cuda_async", {
                "initial_pool_size": initial,
                "release_threshold": threshold,
                "allocation_limit": maximum,
            }
        else:
            kind = stack_kind(initial is not None, self.managed_memory)
        return kind, {"initial_pool_size": initial, "maximum_pool_size": maximum}


def _human(n: int) -> str:
    """Bytes as people read them (binary units): ``8.00 GiB``, ``512 B``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _describe(kind: str, simulate: int | None) -> str:
    """The worker's resource in a few words: ``pool(cuda)``, ``pool(simulated 8.00 GiB)``,
    ``cuda_async``, ``expandable(cuda)``."""
    memory = "managed" if kind.startswith("managed") else "cuda"
    if simulate is not None:
        memory = f"simulated {_human(simulate)}"
    if kind in ("cuda", "managed", "cuda_async", "simulated"):
        return memory if simulate is not None else kind
    return f"{'pool' if kind.endswith('pool') else kind}({memory})"


# ---------------------------------------------------------------- preload


def options_from_config() -> dict[str, Any]:
    """``RRMMSetup``'s keyword arguments from the ``rrmm`` section of Dask's config (keys with
    dashes or underscores; ``pool-size`` is accepted for ``initial-pool-size``, ``async`` for
    ``async-alloc``). A section that is not a mapping is a TypeError; an unknown key, or two
    keys for one option (``pool-size`` and ``initial-pool-size``), a ValueError naming them."""
    section = dask.config.get("rrmm", default={})
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise TypeError(
            f"Dask's `rrmm` config section must be a mapping of options (rrmm: "
            f"{{initial-pool-size: 4GiB, ...}}), not {type(section).__name__} {section!r}"
        )
    names = {
        "initial_pool_size",
        "maximum_pool_size",
        "managed_memory",
        "async_alloc",
        "release_threshold",
        "log_directory",
        "track_allocations",
        "external_lib_list",
        "simulate",
        "allocator",
        "share_gpu",
        "idle_after",
        "share_arrays",
    }
    aliases = {"pool_size": "initial_pool_size", "async": "async_alloc"}
    options: dict[str, Any] = {}
    keys: dict[str, Any] = {}
    for key, value in section.items():
        name = str(key).replace("-", "_")
        name = aliases.get(name, name)
        if name not in names:
            close = difflib.get_close_matches(
                str(key).replace("_", "-"), sorted(n.replace("_", "-") for n in names), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown option {key!r} in Dask's `rrmm` config section{hint}; "
                             f"the options are {', '.join(sorted(names))}")
        if name in keys:
            raise ValueError(
                f"Dask's `rrmm` config section gives {name} twice, as {keys[name]!r} "
                f"({options[name]!r}) and {key!r} ({value!r}): keep one")
        keys[name] = key
        options[name] = value
    return options


def dask_setup(worker: Any) -> None:
    """The preload entry point (``dask worker --preload rrmm.dask``): sets rrmm up from the
    ``rrmm`` section of Dask's config. With ``share-gpu`` the setup also stays among the
    worker's plugins, so that it sees task transitions (``idle-after``) and leaves the ledger
    when the worker closes."""
    plugin = RRMMSetup(**options_from_config())
    plugin.setup(worker)
    plugins = getattr(worker, "plugins", None)
    if (plugin.share_gpu is not None or plugin.share_arrays) and isinstance(plugins, dict):
        plugins[plugin.name] = plugin


# ---------------------------------------------------------------- metrics and the report


def worker_figures() -> dict[str, Any]:
    """This process's rrmm figures (what ``memory_report`` gathers from each worker), with
    ``shared_gpu``: its row of its GPU's ledger (``rrmm.shared_gpu.ProcessRow``) or None."""
    figures = _resource_figures()
    figures["shared_gpu"] = _ledger_row(_state.resource or rrmm.mr.get_current_device_resource())
    return figures


def _resource_figures() -> dict[str, Any]:
    """The resource's figures (what the ``rmm`` metric reads at each heartbeat: no ledger)."""
    mr = _state.resource or rrmm.mr.get_current_device_resource()
    statistics = _state.statistics or _find(mr, rrmm.mr.StatisticsResourceAdaptor)
    pool = _state.pool or _find(mr, rrmm.mr.PoolMemoryResource)
    in_use = peak = 0
    if statistics is not None:
        counts = statistics.allocation_counts
        in_use, peak = int(counts.current_bytes), int(counts.peak_bytes)
    footprint, free, largest = in_use, 0, 0
    if pool is not None:
        footprint = int(pool.pool_size())
        free = int(pool.free_bytes())
        largest = int(pool.largest_free_block())
    fragmentation = 0.0 if free == 0 else 1.0 - largest / free
    return {
        "pid": os.getpid(),
        "resource": _state.description or type(mr).__name__,
        "in_use": in_use,
        "peak": peak,
        "footprint": footprint,
        "fragmentation": fragmentation,
        "largest_free_block": largest,
        "failed_allocations": _state.failed,
        "log_file": _state.log_file,
    }


def _ledger_row(mr: Any) -> ProcessRow | None:
    """This process's row of the ledger of the GPU under ``mr``, None where it has not joined
    one (or ``mr`` is no resource of a GPU's, such as a CUDA resource without a driver)."""
    if not isinstance(mr, rrmm.mr.DeviceMemoryResource):
        return None
    try:
        if not rrmm.shared_gpu.joined(mr):
            return None
        rows = rrmm.shared_gpu.processes(mr)
    except RuntimeError:
        return None
    pid = os.getpid()
    return next((row for row in rows if row.pid == pid), None)


def _rmm_metric(worker: Any = None) -> dict[str, int]:
    """distributed's ``rmm`` worker metric: ``rmm-used`` and ``rmm-total`` (the footprint)."""
    figures = _resource_figures()
    return {
        "rmm-used": figures["in_use"],
        "rmm-total": max(figures["footprint"], figures["in_use"]),
    }


@dataclass
class MemoryRow:
    """One worker's line of ``memory_report``; ``shared_gpu``: the worker's row of its GPU's
    ledger (``rrmm.shared_gpu.ProcessRow``: soft share, live, cached, asleep bytes, idle) where
    it joined one, else None."""

    worker: str
    name: str
    resource: str
    in_use: int
    peak: int
    footprint: int
    fragmentation: float
    largest_free_block: int
    failed_allocations: int
    shared_gpu: ProcessRow | None = None


class MemoryReport:
    """Per-worker memory figures: ``rows`` (``MemoryRow``), ``as_dicts()``, and ``str()`` a
    table."""

    def __init__(self, rows: list[MemoryRow]) -> None:
        self.rows = rows

    def as_dicts(self) -> list[dict[str, Any]]:
        """The rows as plain dicts."""
        return [asdict(r) for r in self.rows]

    def __str__(self) -> str:
        def size(n: int) -> str:
            value = float(n)
            for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
                if value < 1024 or unit == "TiB":
                    return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
                value /= 1024
            return f"{n} B"

        head: tuple[str, ...] = ("worker", "resource", "in use", "peak", "footprint", "frag",
                                 "largest free", "failed")
        lines = [head] + [
            (
                r.name,
                r.resource,
                size(r.in_use),
                size(r.peak),
                size(r.footprint),
                f"{r.fragmentation:.1%}",
                size(r.largest_free_block),
                str(r.failed_allocations),
            )
            for r in self.rows
        ]
        if any(r.shared_gpu is not None for r in self.rows):
            # The ledger's view, only where a worker joined one (the table is as before else).
            head += ("share", "live", "cached", "asleep", "idle")
            lines[0] = head
            for i, r in enumerate(self.rows, start=1):
                g = r.shared_gpu
                lines[i] += ("-",) * 5 if g is None else (
                    "equal part" if g.soft_share is None else size(g.soft_share),
                    size(g.live),
                    size(g.cached),
                    size(g.asleep),
                    "yes" if g.idle else "no",
                )
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines
        )

    def __repr__(self) -> str:
        return f"MemoryReport({len(self.rows)} workers)"


def memory_report(client: Any) -> MemoryReport:
    """Gathers each worker's figures (``worker_figures``) through ``client.run``."""
    figures = client.run(worker_figures)
    names = {
        address: str(info.get("name", address))
        for address, info in client.scheduler_info().get("workers", {}).items()
    }
    rows = [
        MemoryRow(
            worker=address,
            name=names.get(address, address),
            resource=f["resource"],
            in_use=f["in_use"],
            peak=f["peak"],
            footprint=f["footprint"],
            fragmentation=f["fragmentation"],
            largest_free_block=f["largest_free_block"],
            failed_allocations=f["failed_allocations"],
            shared_gpu=f.get("shared_gpu"),
        )
        for address, f in sorted(figures.items(), key=lambda kv: names.get(kv[0], kv[0]))
    ]
    return MemoryReport(rows)


# ---------------------------------------------------------------- sizeof and serializers


@dask.sizeof.sizeof.register(rrmm.DeviceBuffer)
def _sizeof_device_buffer(buffer: Any) -> int:
    return int(buffer.nbytes)


@cuda_serialize.register(rrmm.DeviceBuffer)
def _cuda_serialize_device_buffer(buffer: Any) -> tuple[dict[str, Any], list[Any]]:
    header = dict(buffer.__cuda_array_interface__)
    header["strides"] = (1,)
    return header, [buffer]


@cuda_deserialize.register(rrmm.DeviceBuffer)
def _cuda_deserialize_device_buffer(header: dict[str, Any], frames: list[Any]) -> Any:
    (frame,) = frames
    if isinstance(frame, rrmm.DeviceBuffer):
        return frame
    ptr, _ = frame.__cuda_array_interface__["data"]
    return rrmm.DeviceBuffer(ptr=ptr, size=int(header["shape"][0]))


@dask_serialize.register(rrmm.DeviceBuffer)
def _dask_serialize_device_buffer(buffer: Any) -> tuple[dict[str, Any], list[Any]]:
    header = dict(buffer.__cuda_array_interface__)
    header["strides"] = (1,)
    return header, [memoryview(buffer.copy_to_host())]


@dask_deserialize.register(rrmm.DeviceBuffer)
def _dask_deserialize_device_buffer(header: dict[str, Any], frames: list[Any]) -> Any:
    (frame,) = frames
    return rrmm.DeviceBuffer.to_device(memoryview(frame).cast("B"))
