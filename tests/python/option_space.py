"""The option space of rrmm's entry points, for generated tests (test_options_at_the_call.py):
values of each kind an option may be given, each with the verdict the entry point owes it, and
the check that a refusal names the option and the value.

A value is drawn as ``(good, value)``: ``good`` values must build; the others must be refused
at the call that gives them, by an exception whose message names the option and the value.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

KiB, MiB, GiB, TiB, PiB = (1 << 10), (1 << 20), (1 << 30), (1 << 40), (1 << 50)

#: The largest simulated device, peer GPU or host memory (``rrmm::resource::MAX_SIMULATED_SIZE``).
MAX_SIMULATED = 32 * PiB

#: Units of RMM's grammar that are powers of 1024 (a whole count of one is a multiple of 256
#: from KiB on).
BINARY_UNITS = {"KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}
DECIMAL_UNITS = {"B": 1, "kb": 1000, "MB": 1000**2, "GB": 1000**3}


def size_texts(low: int, high: int, aligned: bool = False) -> st.SearchStrategy[str]:
    """Size strings of RMM's grammar for sizes in [low, high] (multiples of 256 if
    ``aligned``): ``"4MiB"``, ``"512 MiB"``, ``"1000000"``, ``"3GB"``."""
    units = dict(BINARY_UNITS) if aligned else {**BINARY_UNITS, **DECIMAL_UNITS, "": 1}

    def fits(pair: tuple[str, int]) -> bool:
        unit, count = pair
        n = count * units[unit]
        return low <= n <= high and (not aligned or n % 256 == 0)

    return (st.tuples(st.sampled_from(sorted(units)), st.integers(0, 4096))
            .filter(fits)
            .flatmap(lambda pair: st.sampled_from([f"{pair[1]}{pair[0]}",
                                                   f"{pair[1]} {pair[0]}".rstrip()])))


def sizes(low: int, high: int, aligned: bool = False) -> st.SearchStrategy[int | str]:
    """Good sizes in [low, high]: ints and size strings (multiples of 256 if ``aligned``)."""
    ints = st.integers(low, high)
    if aligned:
        ints = st.integers(-(-low // 256), high // 256).map(lambda n: n * 256)
    return st.one_of(ints, size_texts(low, high, aligned))


#: Values no size option takes, whatever the option: negative and past 2**64 - 1, floats,
#: texts that are not sizes (a bare unit among them), and other types.
BAD_SIZES: st.SearchStrategy[Any] = st.one_of(
    st.integers(-(2**70), -1),
    st.integers(1 << 64, 1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["lots", "", "-1", "1e3", "0x10", "4G", "2k", "1.5M", "8 G", "4Gi", "GiB",
                     "12 parsecs", "1,000"]),
    st.sampled_from([[1], {"size": 1}, b"1", object(), (1 << 20,)]),
)

#: Values a whole-number argument of RMM's (``nbytes``, ``size``, a count) does not take: as
#: :data:`BAD_SIZES`, strings too (RMM takes none there).
BAD_WHOLE: st.SearchStrategy[Any] = st.one_of(
    st.integers(-(2**70), -1),
    st.integers(1 << 64, 1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["16", "1MiB", None, [1], object()]),
)


def unaligned(low: int, high: int) -> st.SearchStrategy[int]:
    """Sizes in [low, high] that are no multiple of 256 (RMM's pools refuse them)."""
    return st.integers(low, high).filter(lambda n: n % 256 != 0)


def verdicts(good: st.SearchStrategy[Any],
             bad: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[bool, Any]]:
    """``(True, value)`` for ``good``'s values, ``(False, value)`` for ``bad``'s."""
    return st.one_of(good.map(lambda v: (True, v)), bad.map(lambda v: (False, v)))


def shown_forms(value: Any) -> list[str]:
    """How a message may show ``value``: its text, its repr, and for values that are neither an
    int nor a string (``object()``, a list), its type's name."""
    forms = [str(value), repr(value)]
    if isinstance(value, float) and not math.isfinite(value):
        forms.append(str(value).lower())
    if not isinstance(value, (int, str)):
        forms.append(type(value).__name__)
    return forms


def assert_names(error: BaseException, option: str, value: Any) -> None:
    """``error``'s message names ``option`` and shows ``value`` (as the caller gave it)."""
    message = str(error)
    assert option in message, f"{option!r} not named in {type(error).__name__}: {message}"
    assert any(form in message for form in shown_forms(value)), (
        f"the value {value!r} is not shown in {type(error).__name__}: {message}")


#: The exceptions a refused option raises (RMM's: a bad size is a ValueError or an
#: OverflowError, a wrong type a TypeError, a pool's rule RMM's logic_error, a RuntimeError).
REFUSALS = (TypeError, ValueError, OverflowError, RuntimeError)
