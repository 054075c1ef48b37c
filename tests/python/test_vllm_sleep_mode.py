"""vLLM's sleep mode over rrmm (issue 47), on plain host memory with real bytes: the sleep-mode
backend ``rrmm`` (``rrmm.compat.vllm_sleep_mode``), its plugin entry point
(``rrmm.compat.vllm_plugin``) and ``CuMemAllocator`` (``rrmm.compat.vllm_cumem``).

- The calls' signatures, the attributes and the names vLLM imports are compared with those of
  the vLLM release recorded in ``data/vllm_signatures.json`` (``scripts/vllm_signatures.py``:
  CI has no vLLM).
- A Hypothesis state machine drives the allocator's calls and the backend's against a model of
  vLLM's documented behaviour: tags, sleeps with offload tags, discards, wakes (a wake with tags
  also wakes every tag vLLM never defers), levels, state and usage. After every step every byte
  of a tag that was offloaded (or never slept) is checked; a discarded tag's bytes are free to
  change; a sleeping tag's pool holds no device memory and refuses allocations.
- The plugin imports nothing of vLLM until called, does nothing without vLLM, and registers the
  backend with a factory that behaves as vLLM's (a stand-in built from the record).

The same on a GPU with PyTorch, CUDA graphs and vLLM's own factory:
``test_gpu_vllm_sleep_mode.py``."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rrmm
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from rrmm import mr
from rrmm._rrmm import _clear_per_device_resources, _memory_stats
from rrmm.compat import vllm_cumem, vllm_plugin, vllm_sleep_mode
from rrmm.compat.vllm_cumem import CuMemAllocator
from rrmm.compat.vllm_sleep_mode import RrmmSleepModeBackend
from test_engine_sleep_apis import (  # the engines' tests' pools over host memory and bytes
    PAGE,
    _fresh_current_resource,  # noqa: F401 - its autouse fixture applies here too
    fill,
    host_pool,
    same,
)

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((Path(__file__).parent / "data" / "vllm_signatures.json").read_text())
CUMEM = RECORD["vllm.device_allocator.cumem"]
BACKEND = RECORD["vllm.device_allocator.sleep_mode_backend"]

#: vLLM's attributes rrmm's CuMemAllocator leaves out, and why.
ABSENT_ATTRIBUTES = {
    "pointer_to_data": "vLLM's record of each allocation; rrmm's is each tag's pool",
    "allocator_and_pools": "vLLM's MemPools per tag; rrmm's are kept by rrmm.compat._tag_pools",
    "python_malloc_callback": "vLLM's C extension's callback; rrmm has no such extension",
    "python_free_callback": "vLLM's C extension's callback; rrmm has no such extension",
}


# ------------------------------------------------------------------ vLLM's calls, recorded


def _check_signature(ours: Any, recorded: dict[str, Any], where: str) -> None:
    """``ours`` (as found on the class) takes every call the recorded one takes: the same
    decorator kind, the same parameters in order with the same kinds and defaults; rrmm may add
    parameters after them, each with a default."""
    kinds = {"staticmethod": staticmethod, "classmethod": classmethod}
    for name, kind in kinds.items():
        assert (name in recorded["decorators"]) == isinstance(ours, kind), (where, name)
    func = ours.__func__ if isinstance(ours, staticmethod | classmethod) else ours
    if "contextmanager" in recorded["decorators"]:
        assert inspect.isgeneratorfunction(func.__wrapped__), f"{where}: not a context manager"
    params = list(inspect.signature(func).parameters.values())
    for (name, kind, default), ours_param in zip(recorded["params"], params, strict=False):
        assert (ours_param.name, ours_param.kind.name) == (name, kind), where
        want = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        assert ours_param.default == want, (where, name)
    assert len(params) >= len(recorded["params"]), f"{where}: parameters missing"
    extra = params[len(recorded["params"]):]
    assert all(p.default is not inspect.Parameter.empty for p in extra), where


@pytest.mark.parametrize("name", sorted(CUMEM["CuMemAllocator"]["methods"]))
def test_cumem_allocator_calls_are_vllms(name: str) -> None:
    recorded = CUMEM["CuMemAllocator"]["methods"][name]
    _check_signature(inspect.getattr_static(CuMemAllocator, name), recorded, name)


@pytest.mark.parametrize("name", sorted(BACKEND["SleepModeBackend"]["methods"]))
def test_sleep_mode_backend_calls_are_vllms(name: str) -> None:
    recorded = BACKEND["SleepModeBackend"]["methods"][name]
    _check_signature(inspect.getattr_static(RrmmSleepModeBackend, name), recorded, name)


def test_the_names_and_values_vllm_reads_are_there() -> None:
    for name in CUMEM["imported_by_vllm"]:
        assert hasattr(vllm_cumem, name), f"vLLM imports {name} from vllm.device_allocator.cumem"
    assert vllm_cumem.cumem_available is True
    assert list(vllm_cumem.DEFERRABLE_TAGS) == RECORD["vllm.device_allocator"]["DEFERRABLE_TAGS"]
    assert list(typing.get_args(vllm_sleep_mode.SleepModeState)) == BACKEND["SleepModeState"]
    for name, value in CUMEM["CuMemAllocator"]["class_attributes"].items():
        assert name in vars(CuMemAllocator), name
        if name != "instance":  # the singleton: None until get_instance()
            assert getattr(CuMemAllocator, name) == value, name
    allocator = CuMemAllocator(make_pool=host_pool)
    for name in CUMEM["CuMemAllocator"]["instance_attributes"]:
        assert hasattr(allocator, name) or name in ABSENT_ATTRIBUTES, name
    assert allocator.current_tag == "default"


# ------------------------------------------------------------------ the allocator's calls


def test_a_wake_with_tags_wakes_them_and_every_tag_vllm_never_defers() -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    bufs = {}
    for tag in ("weights", "kv_cache", "runtime", "workspace"):
        with allocator.use_memory_pool(tag=tag):
            bufs[tag] = rrmm.DeviceBuffer(size=PAGE)
    data = {tag: fill(buf, i) for i, (tag, buf) in enumerate(bufs.items())}
    usage = allocator.get_current_usage()
    assert usage >= 4 * PAGE
    allocator.sleep(offload_tags=("weights", "runtime"))
    assert sorted(allocator.asleep_tags()) == ["kv_cache", "runtime", "weights", "workspace"]
    assert allocator.get_current_usage() == usage, "vLLM's usage counts sleeping allocations"
    allocator.wake_up("weights")  # a str is one tag (vLLM: every tag that is a substring of it)
    assert sorted(allocator.asleep_tags()) == ["kv_cache"]
    assert same(bufs["weights"], data["weights"]) and same(bufs["runtime"], data["runtime"])
    assert len(bufs["workspace"].tobytes()) == PAGE, "discarded: mapped again, bytes undefined"
    with pytest.raises(RuntimeError, match="asleep"):
        bufs["kv_cache"].tobytes()
    allocator.wake_up(["kv_cache"])
    assert allocator.asleep_tags() == []
    allocator.sleep("weights")  # a str: one offload tag, as vLLM's
    allocator.wake_up(tags=[])  # no deferrable tag named: every other tag wakes
    assert sorted(allocator.asleep_tags()) == ["kv_cache", "weights"]
    allocator.wake_up()
    assert same(bufs["weights"], data["weights"])


def test_a_sleep_leaves_a_tag_asleep_already_as_it_is() -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    with allocator.use_memory_pool(tag="weights"):
        weights = rrmm.DeviceBuffer(size=PAGE)
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = rrmm.DeviceBuffer(size=2 * PAGE)
    w = fill(weights, 7)
    fill(kv, 8)
    allocator.discard("kv_cache")
    assert allocator.asleep_tags() == ["kv_cache"]
    allocator.discard(("kv_cache",))  # asleep already: nothing
    allocator.sleep(offload_tags=("weights", "kv_cache"))
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    assert tagged.pool("kv_cache").last_sleep()["copied_bytes"] == 0, "discarded stays so"
    assert tagged.pool("weights").last_sleep()["copied_bytes"] == PAGE
    allocator.wake_up()
    assert same(weights, w) and len(kv.tobytes()) == 2 * PAGE


@pytest.mark.parametrize(("call", "message"), [
    (lambda a: a.wake_up(3), "tags must be a str or an iterable of str, not int"),
    (lambda a: a.wake_up(["weights", None]), "tags must hold str tags, not NoneType"),
    (lambda a: a.sleep(offload_tags=[b"weights"]), "offload_tags must hold str tags, not bytes"),
    (lambda a: a.sleep(offload_tags=1.5), "offload_tags must be a str or an iterable"),
    (lambda a: a.discard(None), "tags must be a str or an iterable of str, not NoneType"),
    (lambda a: a.discard(b"kv_cache"), "not bytes"),
])
def test_wrong_types_raise_type_error_and_change_nothing(call: Any, message: str) -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    with allocator.use_memory_pool(tag="weights"):
        buf = rrmm.DeviceBuffer(size=PAGE)
    data = fill(buf, 3)
    with pytest.raises(TypeError, match=message):
        call(allocator)
    assert allocator.asleep_tags() == [] and same(buf, data)
    with pytest.raises(TypeError, match="tag must be a str"), \
            allocator.use_memory_pool(tag=3):  # type: ignore[arg-type]
        pass


def test_cuda_graph_memory_has_its_tag_and_is_kept_at_every_level() -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    backend = RrmmSleepModeBackend(allocator)
    with allocator.cudagraph_pool() as pool_id:
        assert allocator.current_tag == "cudagraph"
        graph_memory = rrmm.DeviceBuffer(size=PAGE)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        assert isinstance(pool_id, tuple), "PyTorch on a GPU: the tag's MemPool's id"
    else:
        assert pool_id is None, "no PyTorch on a GPU here: no MemPool to name"
    assert allocator.current_tag == "default"
    data = fill(graph_memory, 11)
    backend.suspend(level=2)
    assert "cudagraph" in allocator.asleep_tags()
    backend.resume()
    assert same(graph_memory, data)
    allocator.release_pools()
    allocator.close()  # both do nothing, any number of times
    assert same(graph_memory, data)


# ------------------------------------------------------------------ the backend


def test_levels_state_and_a_partial_resume() -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    backend = RrmmSleepModeBackend(allocator)
    tags = ("weights", "kv_cache", "runtime", "workspace")
    bufs = {}
    for tag in tags:
        with allocator.use_memory_pool(tag=tag):
            bufs[tag] = rrmm.DeviceBuffer(size=PAGE)
    tagged = mr.get_current_device_resource()
    assert isinstance(tagged, mr.TaggedMemoryResource)
    for level, copied in ((1, {"weights", "runtime"}), (2, {"runtime"})):
        data = {tag: fill(buf, level) for tag, buf in bufs.items()}
        assert backend.state() == "RUNNING"
        backend.suspend(level)
        assert backend.state() == "SUSPENDED"
        assert sorted(allocator.asleep_tags()) == sorted(tags)
        for tag in tags:
            last = tagged.pool(tag).last_sleep()
            assert last["copied_bytes"] == (PAGE if tag in copied else 0), (level, tag)
        backend.resume(["weights"])
        assert backend.state() == "SUSPENDED", "the KV cache sleeps still"
        backend.resume(["kv_cache"])
        assert backend.state() == "RUNNING"
        for tag in copied:
            assert same(bufs[tag], data[tag]), (level, tag)
    backend.discard(("kv_cache",))
    assert backend.state() == "SUSPENDED" and allocator.asleep_tags() == ["kv_cache"]
    backend.resume()
    assert backend.state() == "RUNNING"


@pytest.mark.parametrize(("level", "error"), [(0, ValueError), (3, ValueError),
                                              ("1", TypeError), (True, TypeError)])
def test_a_level_other_than_1_or_2_is_refused(level: Any, error: type) -> None:
    allocator = CuMemAllocator(make_pool=host_pool)
    with allocator.use_memory_pool(tag="weights"):
        rrmm.DeviceBuffer(size=PAGE)
    with pytest.raises(error, match="level must be"):
        RrmmSleepModeBackend(allocator).suspend(level)
    assert allocator.asleep_tags() == []


def test_the_state_is_resuming_during_a_resume_and_not_after_a_failed_one() -> None:
    seen: list[str] = []

    class Failing(CuMemAllocator):
        fail = False

        def wake_up(self, tags: list[str] | None = None) -> None:
            seen.append(backend.state())
            if self.fail:
                raise MemoryError("no room on the device")
            super().wake_up(tags)

    allocator = Failing(make_pool=host_pool)
    backend = RrmmSleepModeBackend(allocator)
    with allocator.use_memory_pool(tag="kv_cache"):
        rrmm.DeviceBuffer(size=PAGE)
    backend.suspend(1)
    allocator.fail = True
    with pytest.raises(MemoryError):
        backend.resume()
    assert backend.state() == "SUSPENDED"
    allocator.fail = False
    backend.resume()
    assert seen == ["RESUMING", "RESUMING"] and backend.state() == "RUNNING"


def test_the_capability_flags() -> None:
    assert RrmmSleepModeBackend.preserves_communicators() is True
    assert RrmmSleepModeBackend.preserves_compiled_artifacts() is True
    assert RrmmSleepModeBackend.preserves_graphs_with_communicators() is False
    assert RrmmSleepModeBackend.supports_durable_storage() is False


def _run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, with ``args`` and no ``RRMM_AS_*`` switch but ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RRMM_AS_")}
    return subprocess.run([sys.executable, "-c", code, *args], env=dict(environ, **env),
                          capture_output=True, text=True, check=False)


def test_the_backend_is_supported_only_where_vllms_workers_allocate_from_rrmm() -> None:
    """Without ``RRMM_AS_VLLM_CUMEM=1`` vLLM's own allocator serves its workers: refused, with
    the switch named. With it, the remaining condition is a CUDA driver."""
    code = ("from rrmm.compat.vllm_sleep_mode import RrmmSleepModeBackend as B\n"
            "print(repr(B.unsupported_reason())); print(B.is_supported())\n")
    off = _run(code)
    assert off.returncode == 0, off.stderr
    assert "RRMM_AS_VLLM_CUMEM=1" in off.stdout or "does not import" in off.stdout, off.stdout
    assert off.stdout.rstrip().endswith("False") and "not supported" in off.stderr
    on = _run("import _rrmm_as_engines; _rrmm_as_engines.install_from_environment()\n" + code,
              RRMM_AS_VLLM_CUMEM="1")
    assert on.returncode == 0, on.stderr
    from rrmm import _rrmm

    if _rrmm.driver_available():
        assert on.stdout.split() == ["None", "True"], on.stdout
    else:
        assert "no CUDA driver" in on.stdout and on.stdout.rstrip().endswith("False"), on.stdout


# ------------------------------------------------------------------ the plugin


def test_the_wheel_declares_the_plugin_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["vllm.general_plugins"]["rrmm"]
    assert target == "rrmm.compat.vllm_plugin:register"
    from importlib.metadata import entry_points

    installed = entry_points(group="vllm.general_plugins", name="rrmm")
    if not installed:
        pytest.skip("rrmm is not installed as a distribution here (no entry points to read)")
    assert next(iter(installed)).load() is vllm_plugin.register


def test_the_plugin_imports_nothing_of_vllm_and_does_nothing_without_it() -> None:
    run = _run("import sys, rrmm, rrmm.compat.vllm_plugin as p\n"
               "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], 'imported'\n"
               "import importlib.util\n"
               "if importlib.util.find_spec('vllm') is None:\n"
               "    assert p.register() is None and p.register() is None\n"
               "    assert not [m for m in sys.modules if m.startswith('vllm.device')]\n")
    assert run.returncode == 0, run.stderr


#: A stand-in for vLLM's seam (CI has no vLLM): ``SleepModeBackend`` with the recorded
#: abstract methods, and a factory whose ``register_backend`` has the recorded signature and, as
#: vLLM's, refuses a name twice and imports the backend's module when resolved.
_STAND_IN = '''
import abc, importlib, inspect, json, sys, types
record = json.loads(sys.argv[1])
seam = record["vllm.device_allocator.sleep_mode_backend"]
abstract = [n for n, m in seam["SleepModeBackend"]["methods"].items()
            if "abstractmethod" in m["decorators"]]
def _init(self): self._state = "RUNNING"
body = {"__init__": _init}
body.update({n: abc.abstractmethod(lambda self, *a, **k: None) for n in abstract})
Base = abc.ABCMeta("SleepModeBackend", (abc.ABC,), body)
class Factory:
    registry = {}
    @classmethod
    def register_backend(cls, *args, **kwargs):
        names = [p[0] for p in seam["SleepModeBackendFactory.register_backend"]["params"][1:]]
        bound = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for n in names]).bind(*args, **kwargs).arguments
        if bound["name"] in cls.registry:
            raise ValueError("already registered")
        cls.registry[bound["name"]] = (bound["module_path"], bound["class_name"])
    @classmethod
    def get_backend_class(cls, name):
        module, attr = cls.registry[name]
        return getattr(importlib.import_module(module), attr)
module = types.ModuleType("vllm.device_allocator.sleep_mode_backend")
module.SleepModeBackend, module.SleepModeBackendFactory = Base, Factory
for name in ("vllm", "vllm.device_allocator"):
    sys.modules[name] = types.ModuleType(name)
sys.modules[module.__name__] = module
'''


def test_the_plugin_registers_the_backend_with_a_factory_as_vllms() -> None:
    run = _run(_STAND_IN + (
        "from rrmm.compat import vllm_plugin\n"
        "vllm_plugin.register(); vllm_plugin.register()  # loaded twice: no error\n"
        "cls = Factory.get_backend_class('rrmm')\n"
        "assert issubclass(cls, Base) and not inspect.isabstract(cls), cls.__mro__\n"
        "from rrmm.compat.vllm_cumem import CuMemAllocator\n"
        "backend = cls(CuMemAllocator())\n"
        "assert backend.state() == 'RUNNING' and backend._state == 'RUNNING'\n"),
        json.dumps(RECORD))
    assert run.returncode == 0, run.stderr


# ------------------------------------------------------------------ the model


TAGS = ["weights", "kv_cache", "runtime", "cudagraph", "workspace", "default"]
tag_sets = st.lists(st.sampled_from(TAGS), max_size=3, unique=True)


def _as_given(tags: list[str], form: str) -> Any:
    """``tags`` as a caller may give them: a tuple (vLLM's), a list, or a str (one tag)."""
    if form == "str" and len(tags) == 1:
        return tags[0]
    return list(tags) if form == "list" else tuple(tags)


class VllmSleepMachine(RuleBasedStateMachine):
    """The allocator's and the backend's calls against vLLM's documented behaviour: each tag's
    buffers, which tags sleep and whether each kept its contents; usage counts every live
    allocation, asleep or not."""

    def __init__(self) -> None:
        super().__init__()
        _clear_per_device_resources()
        self.allocator = CuMemAllocator(make_pool=host_pool)
        self.backend = RrmmSleepModeBackend(self.allocator)
        self.known: set[str] = set()
        self.asleep: dict[str, bool] = {}  # tag -> its contents were copied
        # (tag, buffer, its bytes or None once discarded, its allocated bytes)
        self.buffers: list[tuple[str, rrmm.DeviceBuffer, np.ndarray | None, int]] = []
        self.seed = 0

    def teardown(self) -> None:
        self.allocator.wake_up()
        self.buffers.clear()
        _clear_per_device_resources()

    def _sleep(self, tags: list[str], keep: set[str]) -> None:
        for tag in tags:
            if tag in self.known and tag not in self.asleep:
                self.asleep[tag] = tag in keep

    def _wake(self, tags: list[str] | None) -> None:
        woken = [t for t in self.asleep
                 if tags is None or t in tags or t not in vllm_cumem.DEFERRABLE_TAGS]
        for tag in woken:
            if not self.asleep.pop(tag):  # discarded: its bytes are free to change
                self.buffers = [(t, b, None if t == tag else d, n) for t, b, d, n in self.buffers]

    @rule(tag=st.sampled_from(TAGS), pages=st.integers(1, 3), extra=st.integers(0, 4096))
    def allocate(self, tag: str, pages: int, extra: int) -> None:
        region = (self.allocator.cudagraph_pool() if tag == "cudagraph"
                  else self.allocator.use_memory_pool(tag=tag))
        before = self.allocator.get_current_usage()
        with region:
            self.known.add(tag)
            if tag in self.asleep:
                with pytest.raises(RuntimeError, match="asleep"):
                    rrmm.DeviceBuffer(size=pages * PAGE + extra)
                return
            buf = rrmm.DeviceBuffer(size=pages * PAGE + extra)
        grew = self.allocator.get_current_usage() - before
        assert buf.size <= grew < buf.size + 4096
        self.seed += 1
        self.buffers.append((tag, buf, fill(buf, self.seed), grew))

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 100))
    def free(self, i: int) -> None:
        self.buffers.pop(i % len(self.buffers))

    @rule(offload=st.none() | tag_sets, form=st.sampled_from(["tuple", "list", "str"]))
    def sleep(self, offload: list[str] | None, form: str) -> None:
        self.allocator.sleep(None if offload is None else _as_given(offload, form))
        self._sleep(TAGS, {"default"} if offload is None else set(offload))

    @rule(tags=tag_sets, form=st.sampled_from(["tuple", "list", "str"]))
    def discard(self, tags: list[str], form: str) -> None:
        self.allocator.discard(_as_given(tags, form))
        self._sleep(tags, set())

    @rule(tags=st.none() | tag_sets, form=st.sampled_from(["tuple", "list", "str"]))
    def wake_up(self, tags: list[str] | None, form: str) -> None:
        self.allocator.wake_up(None if tags is None else _as_given(tags, form))
        self._wake(tags)

    @rule(level=st.sampled_from([1, 2]))
    def suspend(self, level: int) -> None:
        self.backend.suspend(level)
        self._sleep(TAGS, set(vllm_sleep_mode.OFFLOADED_TAGS[level]))

    @rule(tags=st.none() | tag_sets)
    def resume(self, tags: list[str] | None) -> None:
        self.backend.resume(tags)
        self._wake(tags)

    @rule(tags=tag_sets)
    def backend_discard(self, tags: list[str]) -> None:
        self.backend.discard(tuple(tags))
        self._sleep(tags, set())

    @invariant()
    def bytes_state_and_usage_match_the_model(self) -> None:
        for tag, buf, data, _ in self.buffers:
            if tag not in self.asleep and data is not None:
                assert same(buf, data), tag
        assert sorted(self.allocator.asleep_tags()) == sorted(self.asleep)
        assert self.backend.state() == ("SUSPENDED" if self.asleep else "RUNNING")
        assert self.allocator.get_current_usage() == sum(n for *_, n in self.buffers)
        if self.asleep:
            tagged = mr.get_current_device_resource()
            assert isinstance(tagged, mr.TaggedMemoryResource)
            for tag in self.asleep:
                stats = _memory_stats(tagged.pool(tag))
                assert stats is not None and stats["reserved_bytes.all.current"] == 0, tag


TestVllmSleepMachine = VllmSleepMachine.TestCase
TestVllmSleepMachine.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
