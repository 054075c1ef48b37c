"""Each record of figures is declared once, in Rust: its dict's keys (made from the declaration)
and its TypedDict's keys agree (issue 46: a record, its sums, its dict and its stub from one
declaration)."""

from __future__ import annotations

import pytest
from rrmm import _counts, _rrmm, _sleep_types

RECORDS = {
    "SleepEstimate": _sleep_types.SleepFigures,
    "SleepReport": _sleep_types.SleepReport,
    "PromoteReport": _sleep_types.PromoteReport,
    "SpillFigures": _sleep_types.SpillFigures,
    "Movement": _sleep_types.Movement,
    "SupplyFigures": _sleep_types.HostPageFigures,
    "FallbackCounts": _counts.FallbackCounts,
    "TierCounts": _counts.TierCounts,
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_typed_dict_has_its_records_keys(name: str) -> None:
    fields = _rrmm._record_fields(name)
    assert fields is not None
    assert list(RECORDS[name].__annotations__) == fields


def test_an_unknown_record_is_none() -> None:
    assert _rrmm._record_fields("Nope") is None
