"""rrmm.statistics: enabling, push/pop, the context manager and the profiler, on host memory."""

from __future__ import annotations

import threading

import pytest
import rrmm
from rrmm import mr
from rrmm.statistics import (
    ProfilerRecords,
    Statistics,
    enable_statistics,
    get_statistics,
    pop_statistics,
    profiler,
    push_statistics,
    statistics,
)


@pytest.fixture(autouse=True)
def host(system_mr):
    return system_mr


def test_disabled_returns_none():
    assert get_statistics() is None
    assert push_statistics() is None
    assert pop_statistics() is None


def test_enable_is_idempotent(host):
    enable_statistics()
    first = mr.get_current_device_resource()
    assert isinstance(first, mr.StatisticsResourceAdaptor)
    assert first.upstream_mr is host
    enable_statistics()
    assert mr.get_current_device_resource() is first


def test_counts_device_buffers():
    enable_statistics()
    a = rrmm.DeviceBuffer(size=1000)
    b = rrmm.DeviceBuffer(size=24)
    assert get_statistics() == Statistics(
        current_bytes=1024,
        current_count=2,
        peak_bytes=1024,
        peak_count=2,
        total_bytes=1024,
        total_count=2,
    )
    del a
    s = get_statistics()
    assert s.current_bytes == 24 and s.peak_bytes == 1024 and s.total_count == 2
    del b


def test_push_pop():
    enable_statistics()
    keep = rrmm.DeviceBuffer(size=100)
    before = push_statistics()
    assert before.current_bytes == 100
    tmp = rrmm.DeviceBuffer(size=50)
    del tmp
    popped = pop_statistics()
    assert popped.total_bytes == 50 and popped.peak_bytes == 50 and popped.current_bytes == 0
    now = get_statistics()
    assert now.peak_bytes == 150 and now.total_bytes == 150 and now.current_bytes == 100
    del keep


def test_context_manager_installs_and_restores(host):
    with statistics():
        assert isinstance(mr.get_current_device_resource(), mr.StatisticsResourceAdaptor)
        b = rrmm.DeviceBuffer(size=10)
        assert get_statistics().current_bytes == 10
        del b
    assert mr.get_current_device_resource() is host


def test_context_manager_pushes_when_enabled():
    enable_statistics()
    stats_mr = mr.get_current_device_resource()
    with statistics():
        b = rrmm.DeviceBuffer(size=10)
        assert get_statistics().total_bytes == 10
        del b
    assert mr.get_current_device_resource() is stats_mr
    assert get_statistics().total_bytes == 10


def test_context_manager_detects_changes():
    with pytest.raises(ValueError, match="changed"), statistics():
        mr.set_current_device_resource(mr.SystemMemoryResource())


def test_profiler_decorator_and_context():
    records = ProfilerRecords()
    enable_statistics()

    @profiler(records=records)
    def work(n):
        return rrmm.DeviceBuffer(size=n).size

    assert work(100) == 100
    assert work(300) == 300
    with profiler(records=records, name="block"):
        b = rrmm.DeviceBuffer(size=42)
        del b
    recs = records.records
    assert recs["block"] == ProfilerRecords.MemoryRecord(
        num_calls=1, memory_total=42, memory_peak=42
    )
    (func_name,) = [k for k in recs if k != "block"]
    assert "work" in func_name and ".py:" in func_name
    assert recs[func_name].num_calls == 2
    assert recs[func_name].memory_total == 400
    assert recs[func_name].memory_peak == 300
    report = records.report()
    assert report.startswith("Memory Profiling")
    assert "block" in report and "work" in report
    assert records.report(ordered_by="memory_total")


def test_profiler_needs_a_name_as_context_manager():
    enable_statistics()
    with pytest.raises(ValueError), profiler():
        pass


def test_profiler_without_statistics_records_nothing():
    records = ProfilerRecords()

    @profiler(records=records)
    def f():
        return 1

    assert f() == 1
    assert records.records == {}
    assert records.report().endswith("No data, maybe profiling wasn't enabled?")


def test_records_are_thread_safe():
    records = ProfilerRecords()
    stats = Statistics(0, 0, 5, 1, 5, 1)

    def add():
        for _ in range(1000):
            records.add("x", stats)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert records.records["x"].num_calls == 4000
    assert records.records["x"].memory_total == 20000


def test_statistics_is_a_frozen_value():
    import pickle

    s = Statistics(1, 2, 3, 4, 5, 6)
    assert s == Statistics(1, 2, 3, 4, 5, 6) != Statistics(1, 2, 3, 4, 5, 7)
    assert hash(s) == hash(Statistics(1, 2, 3, 4, 5, 6))
    assert pickle.loads(pickle.dumps(s)) == s
    assert repr(s) == (
        "Statistics(current_bytes=1, current_count=2, peak_bytes=3, peak_count=4, "
        "total_bytes=5, total_count=6)"
    )
    with pytest.raises(AttributeError):
        s.current_bytes = 0  # type: ignore[misc]
    assert type(s).__module__ == "rrmm.statistics"
