"""`--fit` on the largest shipped log (100,000 events), against the release wheel CI installs.

The same check in Rust (`replay::tests::fit_on_random_100k_4mib_device_and_fixed_size`) takes
over a minute in a debug build, so `cargo test` leaves it to `--release --ignored`; here it runs
on every CI run at the wheel's speed. The size found replays the log with no failed allocation,
90% of it fails, and it is within 1% (or 64 MiB) of the largest size that fails.
"""

from __future__ import annotations

import pytest
from rrmm import _rrmm, traces

LOG = str(traces.path("random_100k_4mib"))


def _failures(size: int, resource: str) -> int:
    (row,) = _rrmm.replay_logs([LOG], [resource], simulate=size)
    failed = row["failed_allocations"]
    assert failed is not None, row
    return failed


@pytest.mark.parametrize("resource", ["simulated"])
def test_fit_on_the_largest_log_is_the_smallest_size_that_replays(resource: str) -> None:
    (fit,) = _rrmm.fit_logs([LOG], [resource])
    size, failing = fit["device_bytes"], fit["failing_bytes"]
    assert size is not None and failing is not None, fit
    (row,) = _rrmm.replay_logs([LOG], [resource], simulate=size)
    assert size >= row["log_peak_bytes"]
    assert size - failing <= min(max(size // 100, 256), 64 << 20)
    assert _failures(size, resource) == 0
    assert _failures(size // 10 * 9, resource) > 0


def test_fit_says_no_fixed_size_device_serves_requests_above_its_block() -> None:
    (fit,) = _rrmm.fit_logs([LOG], ["fixed_size"])
    assert fit["device_bytes"] is None
    assert fit["reason"] is not None and "above its largest block" in fit["reason"]
