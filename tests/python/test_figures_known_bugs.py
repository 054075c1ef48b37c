"""The bugs in the Rust figures that the state machine's model found (issue 29), one minimal
reproducer each (``FIXED_FIGURE_BUGS`` in test_api_state_machine.py); all fixed, so each must
pass, and the machine checks them strictly."""

from __future__ import annotations

import pytest
from rrmm import _rrmm, mr
from test_api_state_machine import FIXED_FIGURE_BUGS


@pytest.mark.parametrize("bug", sorted(FIXED_FIGURE_BUGS))
def test_fixed_figure_bug(bug: str) -> None:
    exec(FIXED_FIGURE_BUGS[bug], {"mr": mr, "_rrmm": _rrmm})  # noqa: S102 (our own reproducers)
