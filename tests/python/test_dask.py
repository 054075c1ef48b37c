"""rrmm.dask on a CPU-only distributed.LocalCluster (two worker processes, simulated memory)."""

from __future__ import annotations

import inspect
import os

import pytest

distributed = pytest.importorskip("distributed")

import dask
import dask.sizeof
import rrmm
from distributed import Client, LocalCluster
from rrmm.dask import RRMMSetup, memory_report

GiB = 1 << 30


def _resource_chain() -> list[str]:
    import rrmm.mr

    names = []
    mr = rrmm.mr.get_current_device_resource()
    while mr is not None:
        names.append(type(mr).__name__)
        mr = getattr(mr, "upstream_mr", None)
    return names


def _pool_figures() -> tuple[int, int | None]:
    import rrmm.mr
    from rrmm.dask import _find

    pool = _find(rrmm.mr.get_current_device_resource(), rrmm.mr.PoolMemoryResource)
    return pool.pool_size(), pool.maximum_pool_size()


def _hold(nbytes: int) -> int:
    """Allocates nbytes on the worker and keeps the buffer alive there."""
    import rrmm

    global _held
    _held = rrmm.DeviceBuffer(size=nbytes)
    return _held.size


def _metrics(dask_worker) -> dict:
    return dict(dask_worker.metrics["rmm"](dask_worker))


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        yield cluster, client


def test_every_worker_gets_the_resource_asked_for_and_later_workers_too(tmp_path):
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster_, Client(cluster_) as client:
        _check_setup_and_a_later_worker(cluster_, client, tmp_path)


def _check_setup_and_a_later_worker(cluster_, client, tmp_path) -> None:
    client.register_plugin(
        RRMMSetup(
            initial_pool_size="1GiB",
            maximum_pool_size="4GiB",
            simulate="80GiB",
            log_directory=str(tmp_path),
        )
    )
    chains = client.run(_resource_chain)
    assert len(chains) == 2
    for chain in chains.values():
        assert chain == [
            "FailureCallbackResourceAdaptor",
            "StatisticsResourceAdaptor",
            "LoggingResourceAdaptor",
            "PoolMemoryResource",
            "SimulatedMemoryResource",
        ]
    assert set(client.run(_pool_figures).values()) == {(GiB, 4 * GiB)}

    cluster_.scale(3)
    client.wait_for_workers(3, timeout=120)
    chains = client.run(_resource_chain)
    assert len(chains) == 3
    assert all(c[-1] == "SimulatedMemoryResource" and "PoolMemoryResource" in c for c in chains.values())
    names = {str(w["name"]) for w in client.scheduler_info()["workers"].values()}
    logs = {p.name for p in tmp_path.iterdir()}
    # As under dask-cuda with RMM: the adaptor inserts the device (".dev0") before the extension.
    assert logs == {f"rmm_log_{n}.dev0.txt" for n in names}


def test_metrics_and_memory_report_show_each_workers_figures(cluster):
    _, client = cluster
    client.register_plugin(RRMMSetup(initial_pool_size="1GiB", simulate="80GiB"))
    workers = sorted(client.scheduler_info()["workers"])
    assert len(workers) == 2
    sizes = {workers[0]: 3 << 20, workers[1]: 5 << 20}
    for address, nbytes in sizes.items():
        assert client.run(_hold, nbytes, workers=[address])[address] == nbytes
    metrics = client.run(_metrics)
    for address, nbytes in sizes.items():
        assert metrics[address] == {"rmm-used": nbytes, "rmm-total": GiB}
    report = memory_report(client)
    rows = {r.worker: r for r in report.rows}
    for address, nbytes in sizes.items():
        assert rows[address].in_use == nbytes
        assert rows[address].peak == nbytes
        assert rows[address].footprint == GiB
        assert rows[address].largest_free_block == GiB - nbytes
        assert rows[address].failed_allocations == 0
    text = str(report)
    assert "in use" in text and "3.0 MiB" in text and "5.0 MiB" in text
    assert len(report.as_dicts()) == 2


def test_failed_allocations_are_counted(cluster):
    _, client = cluster
    client.register_plugin(
        RRMMSetup(initial_pool_size="1GiB", maximum_pool_size="1GiB", simulate="2GiB")
    )

    def fail() -> str:
        import rrmm

        try:
            rrmm.DeviceBuffer(size=3 << 30)
        except MemoryError:
            return "MemoryError"
        return "allocated"

    assert set(client.run(fail).values()) == {"MemoryError"}
    assert {r.failed_allocations for r in memory_report(client).rows} == {1}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"async_alloc": True, "managed_memory": True}, "is incompatible with the `rmm_async`"),
        ({"release_threshold": "1GiB"}, "`rmm_release_threshold` requires `rmm_async`."),
        ({"maximum_pool_size": "1GiB"}, "was specified without specifying `rmm_pool_size`"),
        ({"external_lib_list": ["jax"]}, "The library 'jax' is not supported"),
        ({"external_lib_list": 3}, "must be either a comma-separated string"),
        ({"initial_pool_size": "lots"}, "rmm_pool_size"),
    ],
)
def test_bad_options_fail_at_registration_and_the_cluster_keeps_working(
    cluster, options, message
):
    _, client = cluster
    with pytest.raises(ValueError, match=message.replace("`", ".").replace("'", ".")):
        client.register_plugin(RRMMSetup(simulate="8GiB", **options))
    assert client.submit(lambda x: x + 1, 1).result() == 2


def test_sizeof_and_serialization_of_a_device_buffer():
    rrmm.mr.set_current_device_resource(rrmm.mr.SimulatedMemoryResource("1GiB"))
    try:
        buffer = rrmm.DeviceBuffer(size=12345)
        assert dask.sizeof.sizeof(buffer) == 12345
        from distributed.protocol import cuda_serialize, dask_serialize

        header, frames = cuda_serialize(buffer)
        assert frames == [buffer] and header["shape"] == (12345,)
        assert dask_serialize.dispatch(rrmm.DeviceBuffer) is not None
    finally:
        rrmm.reinitialize()


def test_preload_reads_the_rrmm_config_section(tmp_path):
    from rrmm.dask import dask_setup, options_from_config, worker_figures

    class FakeWorker:
        name = "tcp://x/w7"

        def __init__(self) -> None:
            self.metrics: dict = {}

    with dask.config.set(
        {"rrmm": {"initial-pool-size": "256MiB", "simulate": "4GiB", "log-directory": str(tmp_path)}}
    ):
        assert options_from_config() == {
            "initial_pool_size": "256MiB",
            "simulate": "4GiB",
            "log_directory": str(tmp_path),
        }
        worker = FakeWorker()
        try:
            dask_setup(worker)
            figures = worker_figures()
            assert figures["footprint"] == 256 << 20
            assert figures["resource"].startswith("pool(simulated")
            assert worker.metrics["rmm"](worker) == {"rmm-used": 0, "rmm-total": 256 << 20}
            assert (tmp_path / "rmm_log_w7.dev0.txt").exists()
        finally:
            rrmm.reinitialize()
    with dask.config.set({"rrmm": {"pool-sise": "1GiB"}}), pytest.raises(ValueError, match="pool-sise"):
        options_from_config()


def test_sizes_are_read_by_the_one_parser_of_the_package():
    """Issue 31: ``RRMMSetup(simulate='8G')`` took 8 * 10**9 bytes (dask's ``parse_bytes``)
    where the command line and ``reinitialize`` refuse ``8G``; every size string now goes
    through ``rrmm.parse_bytes`` (RMM's grammar), which refuses a bare unit with a hint."""
    from rrmm.dask import RRMMSetup, parse_device_bytes

    with pytest.raises(ValueError, match="a bare unit is not a size"):
        parse_device_bytes("4G")
    with pytest.raises(ValueError, match="a bare unit is not a size"):
        RRMMSetup(simulate="8G")
    assert RRMMSetup(simulate="8GB").simulate == 8 * 10**9
    assert parse_device_bytes("4GB") == 4 * 10**9
    assert parse_device_bytes("4GiB") == 4 << 30
    assert parse_device_bytes("0 B") is None
    assert parse_device_bytes(0.5, total=8 << 30) == 4 << 30
    with pytest.raises(ValueError):
        parse_device_bytes("four gigabytes")


def _rmm_on_the_worker() -> tuple[str, int]:
    """What dask-cuda's workers get from ``import rmm`` (RRMM_AS_RMM=1): rrmm, whose pool works
    as RMM's would (on simulated memory here)."""
    import rmm
    import rmm.mr

    pool = rmm.mr.PoolMemoryResource(rmm.mr.SimulatedMemoryResource(4 << 30),
                                      initial_pool_size="256MiB")
    return rmm.__name__, pool.pool_size()


def test_rrmm_as_rmm_reaches_dask_workers(monkeypatch):
    """The README's first Dask route: with ``RRMM_AS_RMM=1`` in the workers' environment, the
    ``import rmm`` that dask-cuda's plugin does gives rrmm in every worker process."""
    monkeypatch.setenv("RRMM_AS_RMM", "1")  # inherited by the worker processes at their start
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        results = client.run(_rmm_on_the_worker)
    assert len(results) == 2
    assert all(r == ("rrmm", 256 << 20) for r in results.values()), results


def test_the_report_names_sizes_as_people_read_them():
    """Issue 31: ``memory_report`` showed ``pool(simulated 8589934592 B)``."""
    from rrmm.dask import _describe

    assert _describe("pool", 8 << 30) == "pool(simulated 8.00 GiB)"
    assert _describe("expandable", 1536 << 20) == "expandable(simulated 1.50 GiB)"
    assert _describe("cuda", 512) == "simulated 512 B"
    assert _describe("pool", None) == "pool(cuda)"


# ---------------------------------------------------------------- one GPU, many workers


@pytest.fixture()
def ledger():
    """A ledger directory with a short path: each member's socket lives in it, and a socket's
    path must fit 108 bytes (pytest's tmp_path, with a test's name, may not)."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="rrmm-ledger-"))  # mode 0700
    yield path
    shutil.rmtree(path, ignore_errors=True)


class _Worker:
    """What the plugin reads of a Dask worker: its name, metrics, plugins and event loop."""

    def __init__(self, name, loop=None) -> None:
        self.name = name
        self.loop = loop
        self.metrics: dict = {}
        self.plugins: dict = {}


class _FakeLoop:
    """``call_later`` that runs nothing until ``fire()``: the idle timer, step by step."""

    class Handle:
        def __init__(self, delay, callback) -> None:
            self.delay, self.callback, self.cancelled = delay, callback, False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self) -> None:
        self.handles: list = []

    def call_later(self, delay, callback):
        self.handles.append(self.Handle(delay, callback))
        return self.handles[-1]

    def pending(self) -> list:
        return [h for h in self.handles if not h.cancelled]

    def fire(self) -> None:
        for handle in self.pending():
            handle.cancelled = True
            handle.callback()


def _idle(mr) -> bool:
    status = rrmm.shared_gpu.status(mr)
    assert status is not None, "the worker left its ledger"
    return bool(status["idle"])


def test_share_gpu_joins_the_workers_ledger_and_idle_after_follows_its_tasks(
    ledger, monkeypatch
):
    import asyncio

    from rrmm.dask import worker_figures

    monkeypatch.setenv("RRMM_LEDGER_DIR", str(ledger))
    loop = asyncio.new_event_loop()
    worker = _Worker("tcp://127.0.0.1:1/w3", loop)
    plugin = RRMMSetup(initial_pool_size="64MiB", simulate="1GiB", share_gpu=True,
                       idle_after=0.05)

    def wait(seconds: float) -> None:
        loop.run_until_complete(asyncio.sleep(seconds))

    try:
        plugin.setup(worker)
        mr = rrmm.mr.get_current_device_resource()
        status = rrmm.shared_gpu.status(mr)
        assert status is not None
        assert status["directory"] == str(ledger / "simulated-1073741824")
        assert [r.name for r in rrmm.shared_gpu.processes(mr)] == ["w3"]
        assert not _idle(mr)
        wait(0.3)
        assert _idle(mr), "no task since the setup: idle after idle_after"
        plugin.transition("a", "ready", "executing", stimulus_id="s")
        assert not _idle(mr), "busy as its task starts executing, before it runs"
        plugin.transition("b", "ready", "executing", stimulus_id="s")
        plugin.transition("a", "executing", "memory", stimulus_id="s")
        wait(0.3)
        assert not _idle(mr), "b still executes"
        plugin.transition("b", "executing", "cancelled", stimulus_id="s")
        wait(0.3)
        assert not _idle(mr), "a cancelled task goes on running on its thread"
        plugin.transition("b", "cancelled", "released", stimulus_id="s")
        plugin.transition("c", "ready", "executing", stimulus_id="s")
        plugin.transition("c", "executing", "memory", stimulus_id="s")
        wait(0.3)
        assert _idle(mr)
        row = worker_figures()["shared_gpu"]
        assert row is not None and row.name == "w3" and row.pid == os.getpid()
        plugin.teardown(worker)
        assert not rrmm.shared_gpu.joined(mr), "the worker leaves its ledger at teardown"
        plugin.transition("d", "ready", "executing", stimulus_id="s")  # after teardown: nothing
        assert worker_figures()["shared_gpu"] is None
    finally:
        loop.close()
        rrmm._rrmm._clear_per_device_resources()


def test_a_transfer_from_an_idle_worker_declares_it_busy_first(ledger, monkeypatch):
    """Another worker's get_data reads this worker's memory outside rrmm: busy before it."""
    import asyncio

    monkeypatch.setenv("RRMM_LEDGER_DIR", str(ledger))
    loop = asyncio.new_event_loop()
    worker = _Worker("tcp://127.0.0.1:1/w5", loop)
    seen: list[bool] = []

    async def get_data(comm, keys=(), who=None):
        seen.append(_idle(rrmm.mr.get_current_device_resource()))
        return {"status": "OK", "data": {}}

    worker.handlers = {"get_data": get_data}
    plugin = RRMMSetup(simulate="1GiB", share_gpu=True, idle_after=0.05)
    try:
        plugin.setup(worker)
        mr = rrmm.mr.get_current_device_resource()
        loop.run_until_complete(asyncio.sleep(0.3))
        assert _idle(mr)
        wrapped = worker.handlers["get_data"]
        assert next(iter(inspect.signature(wrapped).parameters)) == "comm", (
            "Dask passes the comm to a handler whose first parameter is named so"
        )
        out = loop.run_until_complete(wrapped(None, keys=("x",), who="w6"))
        assert out["status"] == "OK" and seen == [False]
        loop.run_until_complete(asyncio.sleep(0.3))
        assert _idle(mr), "idle again after the delay"
        plugin.setup(worker)
        assert worker.handlers["get_data"]._rrmm_wakes, "wrapped once, however often set up"
        assert worker.handlers["get_data"].__wrapped__ is get_data
        plugin.teardown(worker)
    finally:
        loop.close()
        rrmm._rrmm._clear_per_device_resources()


def test_a_task_starting_within_idle_after_cancels_the_idle_declaration(ledger):
    loop = _FakeLoop()
    plugin = RRMMSetup(simulate="1GiB", idle_after=30,
                       share_gpu={"directory": ledger, "name": "mine", "soft_share": "25%"})
    try:
        plugin.setup(_Worker("tcp://x/w0", loop))
        mr = rrmm.mr.get_current_device_resource()
        (row,) = rrmm.shared_gpu.processes(mr)
        assert row.name == "mine" and row.soft_share == (1 << 30) // 4
        assert [h.delay for h in loop.pending()] == [30.0]
        plugin.transition("a", "ready", "executing", stimulus_id="s")
        assert loop.pending() == [], "a task runs: no idle declaration pending"
        plugin.transition("a", "executing", "long-running", stimulus_id="s")  # seceded: runs
        assert loop.pending() == []
        plugin.transition("a", "long-running", "memory", stimulus_id="s")
        plugin.transition("b", "ready", "executing", stimulus_id="s")
        assert loop.pending() == [] and not _idle(mr)
        plugin.transition("b", "executing", "error", stimulus_id="s")
        plugin.transition("x", "fetch", "flight", stimulus_id="s")  # not a task that runs
        assert len(loop.pending()) == 1
        loop.fire()
        assert _idle(mr)
        plugin.transition("c", "ready", "executing", stimulus_id="s")
        assert not _idle(mr)
        plugin.transition("c", "executing", "memory", stimulus_id="s")
        rrmm.shared_gpu.leave(mr)
        loop.fire()  # the worker left meanwhile: nothing to declare, nothing raised
        assert not rrmm.shared_gpu.joined(mr)
    finally:
        rrmm._rrmm._clear_per_device_resources()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"idle_after": 5}, ValueError, "idle_after.*share_gpu"),
        ({"share_gpu": False, "idle_after": 5}, ValueError, "idle_after.*share_gpu"),
        ({"share_gpu": "yes"}, TypeError, "share_gpu. must be True, False or a dict"),
        ({"share_gpu": 1}, TypeError, "share_gpu. must be True, False or a dict"),
        ({"share_gpu": {"soft_shar": "1GiB"}}, ValueError, "unknown option.*soft_shar"),
        ({"share_gpu": {"soft_share": "150%"}}, ValueError, "soft_share.*0% to 100%"),
        ({"share_gpu": {"hard_limit": "lots"}}, ValueError, "hard_limit='lots'"),
        ({"share_gpu": {"hard_limit": -1}}, ValueError, "hard_limit must be >= 0"),
        ({"share_gpu": {"soft_share": 1.5}}, TypeError, "soft_share must be bytes"),
        ({"share_gpu": {"name": 3}}, TypeError, "name must be a str"),
        ({"share_gpu": {"directory": 3}}, TypeError, "directory must be a path"),
        ({"share_gpu": True, "idle_after": -1}, ValueError, "idle_after. must be a finite"),
        ({"share_gpu": True, "idle_after": float("nan")}, ValueError, "finite"),
        ({"share_gpu": True, "idle_after": "30s"}, TypeError, "number of seconds"),
        ({"share_gpu": True, "idle_after": True}, TypeError, "number of seconds"),
    ],
)
def test_bad_share_gpu_and_idle_after_options_are_refused(options, error, message):
    with pytest.raises(error, match=message):
        RRMMSetup(simulate="1GiB", **options)


def test_idle_after_needs_a_worker_with_an_event_loop(ledger):
    plugin = RRMMSetup(simulate="1GiB", share_gpu={"directory": str(ledger)},
                       idle_after=1)
    try:
        with pytest.raises(RuntimeError, match="event loop"):
            plugin.setup(_Worker("w", loop=None))
    finally:
        rrmm._rrmm._clear_per_device_resources()


def test_the_plugin_pickles_without_its_timer(ledger):
    import pickle

    loop = _FakeLoop()
    plugin = RRMMSetup(simulate="1GiB", share_gpu={"directory": str(ledger)},
                       idle_after=2)
    try:
        plugin.setup(_Worker("w", loop))
        copy = pickle.loads(pickle.dumps(plugin))
        assert copy.idle_after == 2.0 and copy.share_gpu == plugin.share_gpu
        copy.transition("a", "ready", "executing")  # not set up: tracks nothing
        assert len(loop.pending()) == 1
    finally:
        plugin.teardown()
        rrmm._rrmm._clear_per_device_resources()


def test_the_preload_reads_share_gpu_and_idle_after_and_stays_among_the_plugins(ledger):
    from rrmm.dask import dask_setup, options_from_config

    config = {"rrmm": {"simulate": "1GiB", "share-gpu": {"directory": str(ledger)},
                       "idle-after": 10}}
    loop = _FakeLoop()
    worker = _Worker("tcp://x/w9", loop)
    with dask.config.set(config):
        assert options_from_config() == {"simulate": "1GiB",
                                         "share_gpu": {"directory": str(ledger)},
                                         "idle_after": 10}
        try:
            dask_setup(worker)
            plugin = worker.plugins[RRMMSetup.name]
            mr = rrmm.mr.get_current_device_resource()
            assert [r.name for r in rrmm.shared_gpu.processes(mr)] == ["w9"]
            plugin.transition("a", "ready", "executing")
            plugin.transition("a", "executing", "memory")
            loop.fire()
            assert _idle(mr)
            plugin.teardown(worker)
            assert not rrmm.shared_gpu.joined(mr)
        finally:
            rrmm._rrmm._clear_per_device_resources()


def _idle_inside_a_task() -> bool:
    import rrmm.shared_gpu

    return bool(rrmm.shared_gpu.status()["idle"])


def _my_ledger_row():
    from rrmm.dask import worker_figures

    return worker_figures()["shared_gpu"]


def test_memory_report_shows_the_ledgers_view_of_each_worker(cluster, ledger):
    import time

    from rrmm.dask import MemoryReport, MemoryRow

    _, client = cluster
    client.register_plugin(RRMMSetup(initial_pool_size="64MiB", simulate="1GiB",
                                     share_gpu={"directory": str(ledger)}, idle_after=0.2))
    names = {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}
    deadline = time.monotonic() + 20
    while True:  # the ledger's entries are written every 250 ms
        rows = client.run(_my_ledger_row)
        if all(r is not None and r.idle for r in rows.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert {a: (r.name, r.idle) for a, r in rows.items()} == {a: (n, True)
                                                             for a, n in names.items()}
    # Busy as soon as a task executes, before it runs.
    assert client.submit(_idle_inside_a_task, pure=False).result() is False
    report = memory_report(client)
    assert len(report.rows) == 2
    for row in report.rows:
        assert row.shared_gpu is not None and row.shared_gpu.name == row.name
        assert row.shared_gpu.soft_share is None
    assert len({r.shared_gpu.pid for r in report.rows}) == 2, "one ledger, both workers"
    head, *lines = str(report).splitlines()
    assert head.split()[-5:] == ["share", "live", "cached", "asleep", "idle"]
    assert all("equal part" in line for line in lines)
    assert report.as_dicts()[0]["shared_gpu"]["name"] == report.rows[0].name
    # Without ledger data the table is as it was.
    plain = MemoryReport([MemoryRow("a", "w", "pool", 0, 0, 0, 0.0, 0, 0)])
    assert "share" not in str(plain) and str(plain).splitlines()[0].split()[-1] == "failed"
    mixed = MemoryReport([*report.rows, MemoryRow("b", "w2", "pool", 0, 0, 0, 0.0, 0, 0)])
    assert str(mixed).splitlines()[-1].split()[-5:] == ["-"] * 5
