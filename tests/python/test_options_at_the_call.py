"""Every option of every entry point is checked where it is given, before anything changes
(issue 50), generated over the option space (option_space.py): Python resources and their
methods, the stack builder, ``reinitialize``, ``rrmm.sleep``, the replay engine's Python door,
the command line (``rrmm replay``, ``rrmm snapshot view``, the environment it reads), the Dask
plugin (``RRMMSetup``, the preload's config section). A bad value raises at the call that
gives it, an exception whose message names the option and the value; a good one builds.

Each entry point's table lists its options, each with a strategy of good and bad values;
one generated test per entry point draws an option and a value.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rrmm
from conftest import gpu_available
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from option_space import (
    BAD_SIZES,
    BAD_WHOLE,
    MAX_SIMULATED,
    REFUSALS,
    GiB,
    KiB,
    MiB,
    TiB,
    assert_names,
    size_texts,
    sizes,
    unaligned,
    verdicts,
)
from rrmm import _rrmm, mr
from small_logs import NINE_MIB_PEAK

#: One simulated device under the resources built here (addresses only: nothing is touched).
DEVICE = mr.SimulatedMemoryResource("1TiB")


@dataclass(frozen=True)
class Option:
    """An option of an entry point: its name as messages give it, the call that gives it a
    value, and its values with their verdicts."""

    name: str
    call: Callable[[Any], Any]
    values: st.SearchStrategy[tuple[bool, Any]]


def check(option: Option, good: bool, value: Any) -> Any:
    """Gives ``option`` ``value``: a good value builds (what the call returns); a bad one is
    refused at this call, naming the option and the value."""
    if good:
        return option.call(value)
    with pytest.raises(REFUSALS) as refused:
        option.call(value)
    assert_names(refused.value, option.name, value)
    return None


def table(options: list[Option]) -> st.SearchStrategy[tuple[Option, bool, Any]]:
    """An option of the table with one of its values."""
    return st.sampled_from(options).flatmap(
        lambda o: o.values.map(lambda verdict: (o, *verdict)))


def ids(options: list[Option]) -> None:
    """Names are unique within a table (a failing draw says which option)."""
    assert len({o.name for o in options}) == len(options)


# ------------------------------------------------------------------ resources and buffers


def _allocated(nbytes: Any) -> None:
    ptr = DEVICE.allocate(nbytes)
    DEVICE.deallocate(ptr, nbytes)


def _device_buffer(size: Any) -> None:
    rrmm.DeviceBuffer(size=size, mr=DEVICE)


RESOURCES = [
    Option("size", lambda v: mr.SimulatedMemoryResource(v),
           verdicts(st.one_of(st.just(0), sizes(256, 1 << 45)),
                    st.one_of(BAD_SIZES, st.integers(1, 255),
                              st.integers(MAX_SIMULATED + 1, (1 << 64) - 1)))),
    Option("host_memory", lambda v: mr.SimulatedMemoryResource("1GiB", host_memory=v),
           verdicts(st.one_of(st.just(0), sizes(256, 1 << 45)),
                    st.one_of(BAD_SIZES, st.integers(1, 255),
                              st.integers(MAX_SIMULATED, (1 << 64) - 1)))),
    Option("initial_pool_size", lambda v: mr.PoolMemoryResource(DEVICE, initial_pool_size=v),
           verdicts(sizes(0, 64 * GiB, aligned=True),
                    st.one_of(BAD_SIZES, unaligned(1, 64 * GiB)))),
    Option("maximum_pool_size",
           lambda v: mr.PoolMemoryResource(DEVICE, initial_pool_size=0, maximum_pool_size=v),
           verdicts(sizes(0, 1 << 62, aligned=True),
                    st.one_of(BAD_SIZES, unaligned(1, 1 << 62)))),
    Option("arena_size", lambda v: mr.ArenaMemoryResource(DEVICE, arena_size=v),
           verdicts(sizes(MiB, 64 * GiB),
                    st.one_of(BAD_SIZES, st.integers(0, MiB - 1)))),
    Option("block_size", lambda v: mr.FixedSizeMemoryResource(DEVICE, block_size=v),
           verdicts(sizes(1, 64 * MiB), st.one_of(BAD_SIZES, st.just(0)))),
    Option("blocks_to_preallocate",
           lambda v: mr.FixedSizeMemoryResource(DEVICE, 4 * KiB, blocks_to_preallocate=v),
           verdicts(st.integers(0, 1024), BAD_WHOLE)),
    Option("allocation_limit", lambda v: mr.LimitingResourceAdaptor(DEVICE, v),
           verdicts(sizes(0, (1 << 64) - 1), BAD_SIZES)),
    Option("release_threshold",
           lambda v: mr.ExpandableMemoryResource(simulated_capacity="64GiB", release_threshold=v),
           verdicts(sizes(0, 1 << 62), BAD_SIZES)),
    Option("simulated_capacity", lambda v: mr.ExpandableMemoryResource(simulated_capacity=v),
           verdicts(sizes(64 * MiB, TiB), BAD_SIZES)),
    Option("HostBuffer: size", lambda v: rrmm.HostBuffer(v, mr=mr.SystemMemoryResource()),
           verdicts(sizes(0, MiB), BAD_SIZES)),
    Option("nbytes", _allocated, verdicts(st.integers(0, GiB), BAD_WHOLE)),
    Option("DeviceBuffer size", _device_buffer, verdicts(st.integers(0, GiB), BAD_WHOLE)),
]
ids(RESOURCES)


@settings(max_examples=300, deadline=None)
@given(drawn=table(RESOURCES))
def test_each_option_of_a_resource_is_checked_at_its_constructor(drawn):
    option, good, value = drawn
    name = option.name.removeprefix("DeviceBuffer ")
    check(Option(name, option.call, option.values), good, value)


@settings(max_examples=100, deadline=None)
@given(good=st.booleans(), value=st.integers(0, 2**63))
def test_an_expandable_pools_sizes_follow_rmms_rules_naming_the_value(good, value):
    """The expandable pool's sizes: RMM's multiples of 256 (the pool's own words, then the
    value and the fix), a maximum of at least one page."""
    value = value // 256 * 256 + (0 if good else 100)
    for name in ("initial_pool_size", "maximum_pool_size"):
        sized = {name: value}
        if good and (name == "maximum_pool_size" and value < 2 * MiB
                     or name == "initial_pool_size" and value > 32 * GiB):
            continue  # less than a page, or more than the simulated device: not this rule
        def call(v: Any, s: dict[str, int] = sized) -> Any:
            return mr.ExpandableMemoryResource(simulated_capacity="64GiB", **s)

        check(Option(name, call, st.nothing()), good, value)


# ------------------------------------------------------------------ the stack builder


STACK = [
    Option("simulate", lambda v: _rrmm.build_stack("pool", simulate=v, initial_pool_size=0),
           verdicts(sizes(256, 1 << 45),
                    st.one_of(BAD_SIZES, st.integers(1, 255),
                              st.integers(MAX_SIMULATED + 1, (1 << 64) - 1)))),
    Option("initial_pool_size",
           lambda v: _rrmm.build_stack("pool", simulate="1TiB", initial_pool_size=v),
           verdicts(sizes(0, 64 * GiB, aligned=True),
                    st.one_of(BAD_SIZES, unaligned(1, 64 * GiB)))),
    Option("peer_memory", lambda v: _rrmm.build_stack("tiered", simulate="1GiB", peer_memory=v,
                                                      initial_pool_size=0),
           verdicts(st.one_of(st.just(0), sizes(256, TiB)),
                    st.one_of(BAD_SIZES, st.integers(1, 255),
                              st.integers(MAX_SIMULATED + 1, (1 << 64) - 1)))),
    Option("host_memory", lambda v: _rrmm.build_stack("managed", simulate="1GiB", host_memory=v),
           verdicts(st.one_of(st.just(0), sizes(256, TiB)),
                    st.one_of(BAD_SIZES, st.integers(1, 255),
                              st.integers(MAX_SIMULATED + 1, (1 << 64) - 1)))),
    Option("block_size", lambda v: _rrmm.build_stack("fixed_size", simulate="1TiB", block_size=v),
           verdicts(sizes(1, 64 * MiB), st.one_of(BAD_SIZES, st.just(0)))),
    Option("blocks", lambda v: _rrmm.build_stack("fixed_size", simulate="1TiB", blocks=v),
           verdicts(st.integers(1, 256),
                    st.one_of(BAD_WHOLE.filter(lambda v: v is not None), st.just(0)))),
    Option("arena_size", lambda v: _rrmm.build_stack("arena", simulate="1TiB", arena_size=v),
           verdicts(sizes(MiB, 64 * GiB), st.one_of(BAD_SIZES, st.integers(0, MiB - 1)))),
    Option("allocation_limit",
           lambda v: _rrmm.build_stack("pool", simulate="1TiB", initial_pool_size=0,
                                       allocation_limit=v),
           verdicts(sizes(0, (1 << 64) - 1), BAD_SIZES)),
]
ids(STACK)


@settings(max_examples=200, deadline=None)
@given(drawn=table(STACK))
def test_each_option_of_the_stack_builder_is_checked_at_the_call(drawn):
    check(*drawn)


def test_a_stack_option_is_checked_before_its_first_layer_and_names_itself():
    """The issue's case: a peer GPU past the largest simulated size blamed ``simulate``."""
    with pytest.raises(ValueError, match=r"`peer_memory`: peer_memory=18446744073709551615"):
        _rrmm.build_stack("tiered", simulate="1GiB", peer_memory=2**64 - 1)
    with pytest.raises(RuntimeError, match=r"^Error, Initial pool size required to be a multiple "
                       r"of 256 bytes \(initial_pool_size=1000: use 768 or 1024\)"):
        _rrmm._check_stack("pool", initial_pool_size=1000)


# ------------------------------------------------------------------ reinitialize


HOOKS: list[str] = []


def _hook() -> None:
    HOOKS.append("ran")


@contextlib.contextmanager
def _hooked():
    """A reinitialize hook that records its runs (a refused call must not run it)."""
    rrmm.register_reinitialize_hook(_hook)
    HOOKS.clear()
    try:
        yield
    finally:
        rrmm.unregister_reinitialize_hook(_hook)


def _reinitialize(**kwargs: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no CUDA device: warns only
        rrmm.reinitialize(**kwargs)


SHARE_GOOD = st.one_of(
    st.fixed_dictionaries({}, optional={
        "soft_share": st.one_of(st.integers(0, 10 * GiB), size_texts(0, 10 * GiB),
                                st.integers(0, 100).map(lambda p: f"{p}%")),
        "name": st.text("abcdef-", min_size=1, max_size=8),
        "device_key": st.text("abcXYZ019._-", min_size=1, max_size=64).filter(
            lambda k: k not in (".", "..")),
    }),
)
SHARE_BAD = st.one_of(
    st.dictionaries(st.sampled_from(["bogus", "soft", "hardlimit"]), st.integers(), min_size=1),
    st.sampled_from([{"soft_share": True}, {"soft_share": "150%"}, {"soft_share": -1},
                     {"soft_share": "lots"}, {"hard_limit": 1.5}, {"device_key": "../x"},
                     {"device_key": ""}, {"device_key": "a" * 65}, {"name": 3},
                     {"soft_share": "2GiB", "hard_limit": "1GiB"}]),
)

REINITIALIZE = [
    Option("initial_pool_size", lambda v: _reinitialize(pool_allocator=True, initial_pool_size=v),
           verdicts(sizes(0, GiB, aligned=True), st.one_of(BAD_SIZES, unaligned(1, GiB)))),
    Option("maximum_pool_size",
           lambda v: _reinitialize(pool_allocator=True, initial_pool_size=0, maximum_pool_size=v),
           verdicts(sizes(0, GiB, aligned=True), st.one_of(BAD_SIZES, unaligned(1, GiB)))),
    Option("pinned_pool_size", lambda v: _reinitialize(pinned_pool_size=v),
           verdicts(sizes(0, GiB), BAD_SIZES)),
    Option("spill_to_host", lambda v: _reinitialize(pool_allocator="expandable", spill_to_host=v),
           verdicts(st.one_of(sizes(0, GiB), st.just(False)), BAD_SIZES)),
    Option("devices", lambda v: _reinitialize(devices=v),
           verdicts(st.one_of(st.integers(0, 7), st.lists(st.integers(0, 7), max_size=3)),
                    st.one_of(st.integers(-99, -1), st.sampled_from(["0", 1.0, [0, "1"],
                                                                     [-1]])))),
    Option("pool_allocator", lambda v: _reinitialize(pool_allocator=v),
           verdicts(st.one_of(st.booleans(),
                              st.sampled_from([k for k in rrmm._stack.kinds()
                                               if k != "simulated"])),
                    st.sampled_from(["pol", "simulated", "expandible", "", "POOL!"]))),
    Option("log_file_name", lambda v: _reinitialize(logging=True, log_file_name=v),
           verdicts(st.sampled_from(["x.csv", Path("y.csv")]), st.sampled_from([3, 1.5, [1]]))),
    Option("share_gpu", lambda v: _reinitialize(share_gpu=v),
           verdicts(st.one_of(st.booleans(), SHARE_GOOD), st.one_of(
               SHARE_BAD, st.sampled_from(["yes", 1, [1]])))),
]
ids(REINITIALIZE)


@pytest.mark.skipif(gpu_available(), reason="builds nothing here only without a GPU (the good "
                    "values would replace the GPU's resources)")
@settings(max_examples=200, deadline=None)
@given(drawn=table(REINITIALIZE))
def test_each_option_of_reinitialize_is_checked_before_a_hook_runs(drawn):
    option, good, value = drawn
    with _hooked():
        if good:
            option.call(value)
            assert HOOKS == ["ran"]
            return
        with pytest.raises(REFUSALS) as refused:
            option.call(value)
        assert HOOKS == [], f"a hook ran before {option.name}={value!r} was refused"
    message = str(refused.value)
    if option.name == "share_gpu" and isinstance(value, dict):
        # A dict's refusal names the key at fault and its value.
        assert any(str(k) in message for k in value), message
        return
    assert_names(refused.value, option.name if option.name != "devices" else "device", value)


# ------------------------------------------------------------------ sleep, spill, promotion


SLEEP = [
    Option("discard", lambda v: rrmm.sleep(DEVICE, discard=v),
           verdicts(st.sampled_from(["all", (), [], [0x1000]]),
                    st.sampled_from(["some", "ALL", 5, 1.5, object()]))),
    Option("discard_fill", lambda v: rrmm.sleep(DEVICE, discard_fill=v),
           verdicts(st.sampled_from(["undefined", "zero"]),
                    st.sampled_from(["zeros", "", "none", "Zero!"]))),
]
ids(SLEEP)


@settings(max_examples=50, deadline=None)
@given(drawn=table(SLEEP))
def test_the_options_of_a_sleep_are_checked_at_the_call_not_at_entering(drawn):
    """``rrmm.sleep(discard="all")`` was a TypeError at ``__enter__`` while
    ``offload(discard="all")`` worked; now both take it, and a bad value is refused by
    ``rrmm.sleep(...)`` itself, before the block is entered."""
    check(*drawn)


def test_a_buffer_of_discard_that_is_none_is_named_by_its_place():
    with pytest.raises(TypeError, match=r"^discard\[1\]=str 'x': str is not a device pointer"):
        rrmm.sleep(DEVICE, discard=[0x1000, "x"])


def _spill_pool(**kw: Any) -> mr.ExpandableMemoryResource:
    return mr.ExpandableMemoryResource(pageable_host=True, reserve_size=64 * MiB,
                                       page_size=2 * MiB, **kw)


def test_spill_options_that_would_be_dropped_are_refused():
    """``spill_to_host`` with plain host memory and no ``device_capacity`` was dropped."""
    with pytest.raises(ValueError, match=r"spill_to_host=8388608: plain host memory without "
                       r"device_capacity .* pageable_host=True with device_capacity=SIZE"):
        _spill_pool(spill_to_host="8MiB")
    assert _spill_pool(spill_to_host="8MiB", device_capacity="16MiB").spill_figures() is not None
    with pytest.raises(RuntimeError, match=r"prepare_spill\(2097152\): this pool never spills"):
        _spill_pool().prepare_spill("2MiB")


def test_promote_of_an_address_no_pool_holds_names_it():
    pool = _spill_pool(spill_to_host="8MiB", device_capacity="16MiB")
    with pytest.raises(ValueError, match=r"`buffer`: 0x3039 is not inside a live allocation"):
        pool.promote(0x3039)
    p = pool.allocate(MiB)
    assert pool.promote(p)["promoted"] == 0  # held, nothing spilled
    pool.deallocate(p, MiB)
    assert DEVICE.promote(0x3039)["promoted"] == 0  # no pool that moves: nothing spilled


def test_the_spill_limits_out_of_memory_names_spill_to_host_once():
    pool = _spill_pool(spill_to_host="4MiB", device_capacity="8MiB")
    with pytest.raises(MemoryError) as refused:
        pool.allocate(32 * MiB)
    message = str(refused.value)
    assert message.startswith("std::bad_alloc: out_of_memory:")
    assert message.count("(failed to allocate") == 1, message
    hint = message.splitlines()[-1]
    assert "spill_to_host" in hint and "held elsewhere" not in hint, hint
    assert "managed_memory" not in hint, hint


# ------------------------------------------------------------------ the replay engine's door


@pytest.fixture(scope="module")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("options") / "nine.csv"
    path.write_text(NINE_MIB_PEAK)
    return str(path)


def _replay_door(log: str) -> list[Option]:
    def replay(**kw: Any) -> Any:
        return _rrmm.replay_logs([log], ["pool"], **{"simulate": "1GiB", **kw})

    return [
        Option("repeat", lambda v: replay(repeat=v),
               verdicts(st.one_of(st.none(), st.integers(1, 2)),
                        st.one_of(st.integers(-5, 0), st.sampled_from(["2", 1.5, True])))),
        Option("simulate", lambda v: replay(simulate=v, initial_pool_size=0),
               verdicts(sizes(16 * MiB, TiB),
                        st.one_of(BAD_SIZES, st.integers(1, 255),
                                  st.integers(MAX_SIMULATED + 1, (1 << 64) - 1)))),
        Option("initial_pool_size", lambda v: replay(initial_pool_size=v),
               verdicts(sizes(0, 256 * MiB, aligned=True),
                        st.one_of(BAD_SIZES, unaligned(1, GiB)))),
    ]


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_each_option_of_the_replay_engine_is_checked_at_the_call(small_log, data):
    option, good, value = data.draw(table(_replay_door(small_log)))
    rows = check(option, good, value)
    if good:
        assert rows[0]["error"] is None, rows[0]["error"]


def test_the_figures_pass_alone_is_asked_for_by_name():
    with pytest.raises(ValueError, match=r"repeat=0: .* pass timed=False"):
        _rrmm.replay_logs([], ["pool"], simulate="1GiB", repeat=0)
    with pytest.raises(ValueError, match=r"repeat=3 with timed=False"):
        _rrmm.replay_logs([], ["pool"], simulate="1GiB", repeat=3, timed=False)


# ------------------------------------------------------------------ the command line


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from rrmm.__main__ import main

    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


#: Each option of ``rrmm replay`` (with the resource that reads it), its good and bad texts.
CLI_REPLAY: list[tuple[str, list[str], st.SearchStrategy[tuple[bool, str]]]] = [
    ("--simulate", ["--resource", "pool"],
     verdicts(st.one_of(size_texts(5 * MiB, TiB), st.integers(5 * MiB, TiB).map(str)),
              st.one_of(st.integers(1, 5 * MiB - 1).map(str),
                        st.sampled_from(["0", "-1", "4G", "lots", "1e3", "64PiB", "80 G"])))),
    ("--initial-pool-size", ["--resource", "pool", "--simulate", "1GiB"],
     verdicts(size_texts(0, 512 * MiB, aligned=True),
              st.one_of(unaligned(1, GiB).map(str), st.sampled_from(["2k", "x", "-256"])))),
    ("--maximum-pool-size", ["--resource", "pool", "--simulate", "1GiB",
                             "--initial-pool-size", "0"],
     verdicts(size_texts(0, 512 * MiB, aligned=True),
              st.one_of(unaligned(1, GiB).map(str), st.sampled_from(["2k", "x"])))),
    ("--block-size", ["--resource", "fixed_size", "--simulate", "1GiB"],
     verdicts(size_texts(1, 8 * MiB), st.sampled_from(["0", "-1", "1M", "x"]))),
    ("--arena-size", ["--resource", "arena", "--simulate", "1GiB"],
     verdicts(size_texts(MiB, 512 * MiB),
              st.one_of(st.integers(0, MiB - 256).map(str), st.sampled_from(["x", "1G"])))),
    ("--blocks", ["--resource", "fixed_size", "--simulate", "1GiB"],
     verdicts(st.integers(1, 64).map(str), st.sampled_from(["0", "-1", "x", "1.5", "1e3"]))),
    ("--bins", ["--resource", "binning", "--simulate", "1GiB"],
     verdicts(st.sampled_from(["18:22", "8:12", "10:10"]),
              st.sampled_from(["22:18", "x", "1:64", "18-22", ":"]))),
    ("--repeat", ["--resource", "pool", "--simulate", "1GiB"],
     verdicts(st.integers(1, 2).map(str), st.sampled_from(["0", "-1", "x", "1.5"]))),
    ("--peer-memory", ["--resource", "tiered", "--simulate", "1GiB"],
     verdicts(size_texts(256, TiB), st.sampled_from(["0", "x", "64PiB", "4G"]))),
    ("--host-memory", ["--resource", "managed", "--simulate", "1GiB"],
     verdicts(size_texts(256, TiB), st.sampled_from(["0", "x", "64PiB", "4G"]))),
]


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_each_option_of_rrmm_replay_is_a_usage_error_naming_it_or_replays(
        small_log, capsys, data):
    flag, context, values = data.draw(st.sampled_from(CLI_REPLAY))
    good, text = data.draw(values)
    code, out, err = run_cli(["replay", small_log, "-q", "--repeat", "1", *context, flag, text],
                             capsys)
    if good:
        assert code == 0, err
        return
    assert code == 2, (flag, text, code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rrmm replay: error:"), err
    assert flag in lines[0] or flag.lstrip("-") in lines[0], err
    assert text in lines[0], err


def test_a_bare_number_smaller_than_the_logs_largest_request_suggests_the_unit(small_log,
                                                                              capsys):
    code, _, err = run_cli(["replay", small_log, "-q", "--simulate", "80"], capsys)
    assert code == 2 and "did you mean --simulate 80GiB?" in err, err
    code, _, err = run_cli(["replay", small_log, "-q", "--simulate", "4MiB", "--repeat", "1"],
                           capsys)
    assert code == 0 and "warning: the simulated device (4.00 MiB" in err, err


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_unknown_option_is_blamed_on_its_subcommand_with_the_close_one(capsys, data):
    command, known = data.draw(st.sampled_from([
        (["replay", "random_10k_1mib"], ["--simulate", "--resource", "--compare", "--plot"]),
        (["snapshot", "view", "random_10k_1mib"], ["--output", "--device", "--title"]),
        (["info"], []),
    ]))
    # A letter more before the last (a prefix would be argparse's abbreviation of the option).
    typo = "--bogus"
    if known:
        option = data.draw(st.sampled_from(known))
        typo = option[:-1] + "x" + option[-1]
    code, _, err = run_cli([*command, typo], capsys)
    name = "rrmm " + " ".join(command[:-1] if command[0] != "info" else command)
    assert code == 2 and err.startswith(f"{name}: error: unrecognized arguments: {typo}"), err
    if known:
        assert "did you mean --" in err, err


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text("01yesnoTrue 2", max_size=4))
def test_the_environment_the_command_line_reads_is_checked_at_start(capsys, monkeypatch, value):
    monkeypatch.setenv("RRMM_PROGRESS", value)
    code, _, err = run_cli(["info"], capsys)
    if value.strip() in ("", "0", "1"):
        assert code == 0, err
    else:
        assert code == 2 and f"RRMM_PROGRESS={value.strip()!r}" in err, err


def test_snapshot_view_refuses_a_device_the_snapshot_has_nothing_of(capsys, tmp_path):
    page = str(tmp_path / "page.html")
    code, _, err = run_cli(["snapshot", "view", "random_10k_1mib", "-q", "--device", "3",
                            "-o", page], capsys)
    assert code == 2 and "--device 3: the snapshot has nothing of device 3" in err, err
    assert not os.path.exists(page)
    code, out, _ = run_cli(["snapshot", "view", "random_10k_1mib", "-q", "-o", page], capsys)
    assert code == 0 and out.strip() == f"wrote {page}"


def test_a_log_named_as_written_suggests_the_file_the_adaptor_wrote(tmp_path, capsys):
    (tmp_path / "mylog.dev0.csv").write_text(NINE_MIB_PEAK)
    named = str(tmp_path / "mylog.csv")
    for command in (["replay", named, "-q"], ["snapshot", "view", named, "-q"]):
        code, _, err = run_cli(command, capsys)
        assert code == 2 and f"did you mean {tmp_path / 'mylog.dev0.csv'}?" in err, err
        assert "inserts the device before the extension" in err


# ------------------------------------------------------------------ the Dask plugin


try:  # the Dask plugin needs distributed (the GPU image has none)
    from rrmm import dask
except ImportError:
    dask = None
needs_dask = pytest.mark.skipif(dask is None, reason="rrmm.dask needs distributed")

DASK = [
    Option("rmm_pool_size", lambda v: dask.RRMMSetup(initial_pool_size=v, simulate="8GiB"),
           verdicts(st.one_of(sizes(0, 4 * GiB), st.floats(0.01, 1.0)),
                    st.one_of(BAD_SIZES.filter(lambda v: not isinstance(v, float)),
                              st.floats(1.01, 1e9), st.floats(-1e9, -0.01)))),
    Option("rmm_maximum_pool_size",
           lambda v: dask.RRMMSetup(initial_pool_size="1MiB", maximum_pool_size=v,
                                    simulate="8GiB"),
           verdicts(sizes(MiB, 4 * GiB),
                    st.one_of(BAD_SIZES.filter(lambda v: not isinstance(v, float)),
                              st.floats(1.01, 1e9)))),
    Option("simulate", lambda v: dask.RRMMSetup(simulate=v),
           verdicts(sizes(256, TiB),
                    st.one_of(BAD_SIZES.filter(lambda v: not isinstance(v, float)),
                              st.integers(MAX_SIMULATED + 1, 1 << 70), st.just(0)))),
    Option("share_gpu", lambda v: dask.RRMMSetup(simulate="1GiB", share_gpu=v),
           verdicts(st.one_of(st.booleans(), SHARE_GOOD),
                    st.one_of(SHARE_BAD, st.sampled_from(["yes", 1])))),
    Option("idle_after", lambda v: dask.RRMMSetup(simulate="1GiB", share_gpu=True, idle_after=v),
           verdicts(st.one_of(st.none(), st.floats(0, 1e6)),
                    st.one_of(st.floats(-1e6, -0.001), st.sampled_from([float("nan"),
                                                                        float("inf"), "30s",
                                                                        True])))),
    Option("share_arrays", lambda v: dask.RRMMSetup(allocator="expandable", share_arrays=v),
           verdicts(st.booleans(), st.sampled_from(["yes", 1, None, 0.0]))),
    Option("allocator", lambda v: dask.RRMMSetup(simulate="1GiB", allocator=v),
           verdicts(st.sampled_from(["pool", "arena", "expandable", "binning"]),
                    st.sampled_from(["pol", "", "simulatd"]))),
]
ids(DASK)


@needs_dask
@settings(max_examples=150, deadline=None)
@given(drawn=table(DASK))
def test_each_option_of_the_dask_plugin_is_checked_in_its_constructor(drawn):
    option, good, value = drawn
    if not good and option.name == "share_gpu" and isinstance(value, dict):
        with pytest.raises(REFUSALS) as refused:
            option.call(value)
        assert "share_gpu" in str(refused.value)
        assert any(str(k) in str(refused.value) for k in value), str(refused.value)
        return
    plugin = check(option, good, value)
    if good and option.name in ("rmm_pool_size", "rmm_maximum_pool_size", "simulate",
                                "allocator"):
        # What the constructor accepted, the worker's setup builds.
        try:
            plugin.setup(None)
        finally:
            rrmm.mr.set_current_device_resource(DEVICE)


@needs_dask
def test_the_issues_dask_options_fail_in_the_constructor_not_in_setup():
    for options, named in [
        ({"share_gpu": {"device_key": "../x"}}, "device_key"),
        ({"simulate": 2**64}, "simulate"),
        ({"initial_pool_size": 2**70, "simulate": "8GiB"}, "rmm_pool_size"),
        ({"simulate": 2**60}, "simulate"),
    ]:
        with pytest.raises(ValueError, match=named):
            dask.RRMMSetup(**options)


SECTIONS = st.one_of(
    st.sampled_from(["4GiB", 3, ["initial-pool-size"], True]).map(lambda s: (False, s)),
    st.dictionaries(st.sampled_from(["initial-pool-size", "simulate", "managed-memory"]),
                    st.sampled_from(["64MiB", "1GiB"]), max_size=2).map(lambda s: (True, s)),
    st.sampled_from([
        {"pool-size": "1GiB", "initial-pool-size": "2GiB"},
        {"initial_pool_size": "1GiB", "initial-pool-size": "1GiB"},
        {"async": True, "async-alloc": True},
        {"inital-pool-size": "1GiB"},
        {"bogus": 1},
    ]).map(lambda s: (False, s)),
)


@needs_dask
@settings(max_examples=60, deadline=None)
@given(drawn=SECTIONS)
def test_the_config_section_is_checked_where_it_is_read(drawn):
    import dask as dask_core

    good, section = drawn
    with dask_core.config.set({"rrmm": section}):
        if good:
            options = dask.options_from_config()
            assert len(options) == len(section)
            return
        with pytest.raises((TypeError, ValueError)) as refused:
            dask.options_from_config()
    message = str(refused.value)
    assert "rrmm" in message, message
    if isinstance(section, dict):
        assert all(str(k) in message for k in section), message
    else:
        assert repr(section) in message, message


# ------------------------------------------------------------------ signatures


def _callables() -> list[tuple[str, Any]]:
    """Every public callable of rrmm's compiled module and its classes' methods."""
    out = []
    for name in dir(_rrmm):
        obj = getattr(_rrmm, name)
        if isinstance(obj, type):
            out.append((name, obj))
            out += [(f"{name}.{m}", getattr(obj, m)) for m in vars(obj)
                    if callable(getattr(obj, m, None)) and not m.startswith("__")]
        elif callable(obj):
            out.append((name, obj))
    return out


def test_every_signature_shows_its_real_defaults():
    """``inspect.signature`` showed ``min_size_exponent=Ellipsis`` and ``stream=Ellipsis``
    (PyO3 writes ``...`` for a default it cannot spell): the literals are spelt, and the
    constructors show the stream they default to. A method's ``stream=`` default stays ``...``:
    a compiled method's text signature can spell only literals (``inspect`` refuses one that
    names an object), and a Python wrapper would slow every call."""
    import inspect

    shown = []
    for name, obj in _callables():
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            continue  # no signature to show (a builtin without one)
        for p in signature.parameters.values():
            if p.default is Ellipsis and (p.name != "stream" or isinstance(obj, type)):
                shown.append(f"{name}{signature}")
    assert not shown, "\n".join(shown)
    assert str(inspect.signature(mr.BinningMemoryResource)).startswith(
        "(upstream_mr=None, min_size_exponent=-1, max_size_exponent=-1")
    assert inspect.signature(mr.FixedSizeMemoryResource).parameters[
        "blocks_to_preallocate"].default == 128
    stream = inspect.signature(rrmm.DeviceBuffer).parameters["stream"].default
    assert stream is rrmm.pylibrmm.stream.DEFAULT_STREAM


def test_a_plain_size_is_read_without_a_python_call() -> None:
    """Every DeviceBuffer reads its size: an int (a subclass too) is read by the C API, never
    through a Python-level ``__index__`` call (that call cost the round trip 39% more
    instructions); an object that is only ``__index__``-able is still taken."""
    calls = []

    class Size(int):
        def __index__(self) -> int:
            calls.append(1)
            return int(self)

    class Index:
        def __index__(self) -> int:
            return 4096

    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource("1GiB"))
    assert rrmm.DeviceBuffer(size=Size(1 << 20), mr=pool).size == 1 << 20
    assert calls == [], "an int's size went through a Python call"
    assert rrmm.DeviceBuffer(size=Index(), mr=pool).size == 4096
