"""Every option of ``rrmm replay`` either changes what the command does or is refused (issue 39:
``--peer-memory`` without tiered, ``--resource`` with ``--compare`` and ``--compare
pool,,binning`` did nothing, silently). Generated from the parser itself: each resource
option against every resource (read: the figures or the setup change; not read: a usage error,
and the engine given it directly shows it would have changed nothing), each other option
against a run without it; the lists of names of ``--compare`` and the sizes of simulated
memory from Hypothesis. Runs in-process on a small simulated device."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rrmm import _rrmm
from rrmm.__main__ import build_parser, main
from rrmm._cli_replay import (
    MAX_SIMULATED_BYTES,
    OPTION_READERS,
    SIMULATED_ONLY_OPTIONS,
    SOURCE_RESOURCES,
    _sizing,
)
from small_logs import NINE_MIB_PEAK

pytestmark = pytest.mark.skipif(_rrmm.replay_gpu_available(),
                                reason="a GPU: the resources replay on it (this is the CPU run)")

#: Peak 9 MiB in use, on one stream.
LOG = NINE_MIB_PEAK
DEVICE = "1GiB"
KNOWN = list(_rrmm.replay_resource_names())

#: A value of each resource option that changes the setup or the figures of every resource
#: reading it (on the 1 GiB device, for this log).
VALUES: dict[str, str] = {
    "initial_pool_size": "64MiB",
    "maximum_pool_size": "768MiB",
    "bins": "16:20",
    "block_size": "8MiB",
    "blocks": "4",
    "arena_size": "256MiB",
    "host_memory": "2GiB",
    "peer_memory": "128MiB",
}

#: The figures of a row that depend on the setup, not on the clock.
TIMINGS = {"total_ns", "ns_per_event", "ns_per_event_min", "ns_per_event_max",
           "ns_per_event_p25", "ns_per_event_p75", "spread", "repeats", "samples_ns"}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("options") / "small.csv"
    path.write_text(LOG)
    return str(path)


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    files: list[str] = field(default_factory=list)


def run(argv: list[str], folder: Path | None = None) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    before = set(os.listdir(folder)) if folder else set()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    files = sorted(set(os.listdir(folder)) - before) if folder else []
    return Outcome(code, out.getvalue(), err.getvalue(), files)


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def rows(out: str) -> list[dict]:
    """The rows of a ``--json`` report without their timings."""
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in json.loads(out)["reports"]]


@cache
def baseline(log: str, resource: str) -> str:
    result = run(["replay", log, "--simulate", DEVICE, "--repeat", "1", "--resource", resource,
                  "--json"])
    assert result.code == 0, result.err
    return json.dumps(rows(result.out))


def canonical(resource: str) -> str:
    """The row a resource asked for is on simulated memory."""
    return "simulated" if resource in SOURCE_RESOURCES else resource


def test_each_resource_option_of_the_parser_has_readers_and_a_value():
    parser = _replay_parser()
    args = parser.parse_args(["log"])
    assert set(_sizing(args)) == set(OPTION_READERS) == set(VALUES)
    for readers in OPTION_READERS.values():
        assert set(readers) <= set(KNOWN), readers


@pytest.mark.parametrize("resource", KNOWN)
@pytest.mark.parametrize("option", sorted(VALUES))
def test_a_resource_option_changes_its_readers_and_is_refused_by_the_others(log, option,
                                                                           resource):
    argv = ["replay", log, "--simulate", DEVICE, "--repeat", "1", "--resource", resource,
            flag(option), VALUES[option], "--json"]
    result = run(argv)
    if canonical(resource) in OPTION_READERS[option]:
        assert result.code == 0, result.err
        assert json.dumps(rows(result.out)) != baseline(log, resource), (
            f"{flag(option)} {VALUES[option]} changed nothing for {resource}")
        return
    assert result.code == 2, (result.code, result.out[:200])
    (line,) = result.err.strip().splitlines()
    assert line.startswith(f"rrmm replay: error: {flag(option)} would change nothing"), line
    # Refused rightly: the engine, given the option, shows the same setup and figures.
    sizing = _sizing(_replay_parser().parse_args([log, flag(option), VALUES[option]]))
    assert engine_rows(log, resource, {option: sizing[option]}) == engine_rows(log, resource), (
        f"{flag(option)} is read by {resource}")


def engine_rows(log: str, resource: str, options: dict | None = None) -> list[dict]:
    """The replay engine's rows (without timings) for ``resource`` on the device."""
    records = _rrmm.replay_logs([log], [canonical(resource)], simulate=1 << 30, repeat=1,
                                **(options or {}))
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


@pytest.mark.parametrize("option", SIMULATED_ONLY_OPTIONS)
def test_options_of_simulated_memory_are_refused_on_the_gpu(log, option, monkeypatch):
    monkeypatch.setattr(_rrmm, "replay_gpu_available", lambda: True)
    result = run(["replay", log, "--resource", "tiered", flag(option), "1GiB"])
    assert result.code == 2 and "read on a simulated device only" in result.err, result.err


@dataclass
class Effect:
    """What an option changes: the run with ``extra`` against the run without it (both of
    ``log`` with ``base``, in ``env``)."""

    extra: list[str]
    base: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log: str = "{log}"


#: Each option that is not a resource option, with a run that shows what it does. An option
#: added to ``rrmm replay`` without an entry here (or in OPTION_READERS) fails the test.
EFFECTS: dict[str, Effect] = {
    "help": Effect(["--help"]),
    "resource": Effect(["--resource", "binning"]),
    "compare": Effect(["--compare", "pool,arena"]),
    "simulate": Effect(["--simulate", "2GiB"]),
    "repeat": Effect(["--repeat", "3"]),
    "fit": Effect(["--fit"]),
    "plot": Effect(["--plot", "{folder}/replay.png"]),
    "json": Effect(["--json"]),
    "quiet": Effect(["--quiet"], env={"RRMM_PROGRESS": "1"}),
    "check": Effect(["--check"], base=["--simulate", "4MiB"]),
    "lenient": Effect(["--lenient"], log="{bad_log}"),
}


def _replay_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    group = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return group.choices["replay"]


def _options() -> Iterator[str]:
    for action in _replay_parser()._actions:
        if action.option_strings:
            yield action.dest


def test_every_option_has_an_effect_or_readers():
    assert set(_options()) == set(EFFECTS) | set(OPTION_READERS)


@pytest.mark.parametrize("option", sorted(EFFECTS))
def test_every_other_option_changes_what_the_command_does(log, option, tmp_path, monkeypatch):
    effect = EFFECTS[option]
    bad_log = tmp_path / "bad.csv"
    bad_log.write_text(LOG + "1,t,allocate,not-a-pointer,x,0\n")
    names = {"folder": str(tmp_path), "bad_log": str(bad_log), "log": log}
    for key, value in {"RRMM_PROGRESS": "0", **effect.env}.items():
        monkeypatch.setenv(key, value)
    base = ["replay", effect.log.format(**names), "--simulate", DEVICE, "--repeat", "1"]
    base += [a.format(**names) for a in effect.base]
    without = run(base, tmp_path)
    with_it = run(base + [a.format(**names) for a in effect.extra], tmp_path)

    def seen(o: Outcome) -> tuple:
        # Timings blanked: what the option changes is not the clock.
        return (o.code, re.sub(r"[0-9.]+", "N", o.out), re.sub(r"[0-9.]+", "N", o.err), o.files)

    assert seen(with_it) != seen(without), f"{option} changed nothing"


# ------------------------------------------------------------------ refusals of the names


NAMES = st.sampled_from([n for n in KNOWN if n not in SOURCE_RESOURCES])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(NAMES, min_size=1, max_size=4), empty=st.data())
def test_an_empty_name_in_compare_is_refused_naming_its_place(names, empty):
    place = empty.draw(st.integers(0, len(names)))
    blank = empty.draw(st.sampled_from(["", " ", "\t"]))
    entries = [*names[:place], blank, *names[place:]]
    text = ",".join(entries)
    result = run(["replay", "log.csv", "--simulate", DEVICE, "--compare", text])
    assert result.code == 2, result
    (line,) = result.err.strip().splitlines()
    assert f"name {place + 1} of {len(entries)} is empty" in line, line


@settings(max_examples=30, deadline=None)
@given(resource=NAMES, compare=st.lists(NAMES, min_size=1, max_size=3).map(",".join))
def test_resource_with_compare_is_refused(resource, compare):
    result = run(["replay", "log.csv", "--simulate", DEVICE, "--resource", resource,
                  "--compare", compare])
    assert result.code == 2
    (line,) = result.err.strip().splitlines()
    assert "--resource" in line and "--compare" in line and "both given" in line, line


@settings(max_examples=60, deadline=None)
@given(option=st.sampled_from(["--simulate", "--peer-memory", "--host-memory"]),
       size=st.integers(MAX_SIMULATED_BYTES + 1, (1 << 64) - 1))
def test_simulated_memory_past_its_largest_size_is_a_usage_error_naming_it(option, size):
    argv = ["replay", "log.csv", "--resource", "tiered", "--simulate", DEVICE, option, str(size)]
    result = run(argv)
    assert result.code == 2
    (line,) = result.err.strip().splitlines()
    assert f"argument {option}: '{size}'" in line and "at most 32.00 PiB" in line, line


def test_the_largest_simulated_size_is_the_engines(log):
    (fits,) = _rrmm.replay_logs([log], ["simulated"], simulate=MAX_SIMULATED_BYTES, repeat=1)
    assert fits["error"] is None
    # Past it, the engine refuses at the call, before any log is read (issue 50: it was the
    # row's error), naming the option and the largest.
    with pytest.raises(ValueError, match=f"simulate={MAX_SIMULATED_BYTES + 256} bytes is more "
                       f"than simulated memory can be: at most {MAX_SIMULATED_BYTES}"):
        _rrmm.replay_logs([log], ["simulated"], simulate=MAX_SIMULATED_BYTES + 256, repeat=1)


@pytest.mark.parametrize("host", ["32PiB", str(MAX_SIMULATED_BYTES - (1 << 30) + 256)])
def test_host_memory_beside_the_device_past_the_largest_size_is_refused(log, host):
    result = run(["replay", log, "--simulate", DEVICE, "--resource", "managed",
                  "--host-memory", host, "--repeat", "1"])
    assert result.code == 2 and "--host-memory" in result.err, result
    assert f"at most {MAX_SIMULATED_BYTES - (1 << 30)} bytes of host memory" in result.err
    fits = run(["replay", log, "--simulate", DEVICE, "--resource", "managed",
                "--host-memory", str(MAX_SIMULATED_BYTES - (1 << 30)), "--repeat", "1"])
    assert fits.code == 0 and "no figures" not in fits.out, fits


# ------------------------------------------------------------------ --compare all


@pytest.mark.parametrize("resource", KNOWN)
def test_compare_all_replays_every_resource_kind(log, resource):
    result = run(["replay", log, "--simulate", DEVICE, "--compare", "all", "--repeat", "1",
                  "--json"])
    assert result.code == 0, result.err
    reports = {r["resource"]: r for r in json.loads(result.out)["reports"]}
    row = reports.get(canonical(resource))
    assert row is not None, f"--compare all left out {resource}"
    assert row["error"] is None, row["error"]
