"""rrmm.dask on a CPU-only distributed.LocalCluster (two worker processes, simulated memory)."""

from __future__ import annotations

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
