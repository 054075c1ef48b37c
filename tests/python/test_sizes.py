"""One size parser for the whole package (issue 31): ``rrmm.parse_bytes`` (RMM's grammar, in
Rust) reads every size string, and the command line, ``reinitialize`` and ``rrmm.dask`` give the
same bytes or the same refusal for any string. Generated strings are checked against RMM's own
regular expression. ``4G`` is not a size anywhere: RMM refuses it, and tools disagree on whether
it means 4 GiB or 4 GB."""

from __future__ import annotations

import argparse
import os
import re

import pytest
import rrmm
from hypothesis import given, settings
from hypothesis import strategies as st
from rrmm import rmm as rrmm_rmm
from rrmm._cli_replay import parse_size

PROFILE = os.environ.get("RRMM_HYPOTHESIS", "ci")
EXAMPLES = {"ci": 400, "long": 20000}.get(PROFILE, 400)

#: RMM's parse_bytes (rmm/_lib/helper): the grammar, and kb = 1000, kib = 1024.
RMM_PATTERN = re.compile(r"^([0-9]+(?:\.[0-9]*)?)[\t ]*((?i:(?:[kmgtp]i?)?b))?$")
POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def rmm_reference(text: str) -> int | None:
    match = RMM_PATTERN.match(text)
    if match is None:
        return None
    number, unit = match.group(1), (match.group(2) or "").lower()
    power = POWERS[unit.removesuffix("b").removesuffix("i")]
    multiplier = (1024 if "i" in unit else 1000) ** power
    whole, _, fraction = number.partition(".")
    value = (int(whole) * multiplier if not fraction.strip("0")
             else int(float(number) * multiplier))
    return value if value < 2**64 else None


UNITS = st.builds(lambda p, i, b: p + i + b, st.sampled_from(["", "k", "K", "m", "M", "g", "G",
                                                              "t", "T", "p", "P", "x"]),
                  st.sampled_from(["", "i", "I"]), st.sampled_from(["", "b", "B"]))
SIZE_STRINGS = st.one_of(
    st.builds(lambda n, f, s, u, tail: n + f + s + u + tail,
              st.integers(0, 10**22).map(str),
              st.sampled_from(["", ".", ".5", ".25", ".000", ".999"]),
              st.sampled_from(["", " ", "\t", "  "]),
              UNITS,
              st.sampled_from(["", "", "\n", " ", "x"])),
    st.text(alphabet="0123456789.kmgtpibKMGTPIB \t-e+", max_size=10),
)


def outcome(parse, text: str):
    try:
        return parse(text)
    except (ValueError, OverflowError, argparse.ArgumentTypeError):
        return "refused"


@settings(max_examples=EXAMPLES, deadline=None)
@given(text=SIZE_STRINGS)
def test_every_door_reads_a_size_string_alike(text):
    pytest.importorskip("distributed")  # rrmm.dask needs it (the GPU image has none)
    from rrmm.dask import parse_device_bytes

    expected = rmm_reference(text)
    got = outcome(rrmm.parse_bytes, text)
    assert got == (expected if expected is not None else "refused"), (text, got, expected)
    # The command line, reinitialize's pool sizes and rrmm.dask read it the same way.
    assert outcome(parse_size, text) == got
    assert outcome(lambda t: rrmm_rmm._size(t, "initial_pool_size"), text) == got
    dask = outcome(lambda t: parse_device_bytes(t, alignment=1), text)
    assert dask == (None if got == 0 else got), (text, dask, got)


@pytest.mark.parametrize("bare", ["4G", "4g", "2k", "1.5M", "8 G", "4Gi"])
def test_a_bare_unit_is_refused_everywhere_with_the_reason(bare):
    pytest.importorskip("distributed")  # rrmm.dask needs it (the GPU image has none)
    from rrmm.dask import RRMMSetup

    for parse in (rrmm.parse_bytes, lambda t: rrmm_rmm._size(t, "initial_pool_size"),
                  lambda t: RRMMSetup(simulate=t)):
        with pytest.raises(ValueError, match="a bare unit is not a size"):
            parse(bare)
    with pytest.raises(argparse.ArgumentTypeError, match="a bare unit is not a size"):
        parse_size(bare)
