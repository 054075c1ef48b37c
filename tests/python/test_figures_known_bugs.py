"""The bugs in the Rust figures that the state machine's model found (issue 29), one minimal
reproducer each, kept as expected failures until their fix lands (the machine records them
instead of failing; see ``KNOWN_FIGURE_BUGS`` in test_api_state_machine.py). An unexpected pass
means the bug is fixed: remove its entry there, and the check becomes strict in the machine."""

from __future__ import annotations

import pytest
from rrmm import _rrmm, mr
from test_api_state_machine import KNOWN_FIGURE_BUGS


@pytest.mark.xfail(reason="a bug in the Rust figures, found by the state machine", strict=False)
@pytest.mark.parametrize("bug", sorted(KNOWN_FIGURE_BUGS))
def test_known_figure_bug(bug: str) -> None:
    exec(KNOWN_FIGURE_BUGS[bug], {"mr": mr, "_rrmm": _rrmm})  # noqa: S102 (our own reproducers)
