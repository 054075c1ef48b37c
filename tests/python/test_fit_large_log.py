"""`--fit` on the shipped logs, against the release wheel CI installs.

The same checks in Rust (`replay::tests::fit_on_random_100k_4mib_device_and_fixed_size`, over a
minute in a debug build, and `fit_on_the_small_shipped_traces_...`, 20 s) run under `cargo test
--release -- --ignored`; here they run on every CI run at the wheel's speed. The size found replays the log with no failed allocation,
90% of it fails, and it is within 1% (or 64 MiB) of the largest size that fails.
"""

from __future__ import annotations

import pytest
from rrmm import _rrmm, traces

LOG = str(traces.path("random_100k_4mib"))


def _failures(size: int, resource: str) -> int:
    (row,) = _rrmm.replay_logs([LOG], [resource], simulate=size, repeat=1)
    failed = row["failed_allocations"]
    assert failed is not None, row
    return failed


@pytest.mark.parametrize("resource", ["simulated"])
def test_fit_on_the_largest_log_is_the_smallest_size_that_replays(resource: str) -> None:
    (fit,) = _rrmm.fit_logs([LOG], [resource])
    size, failing = fit["device_bytes"], fit["failing_bytes"]
    assert size is not None and failing is not None, fit
    (row,) = _rrmm.replay_logs([LOG], [resource], simulate=size, repeat=1)
    assert size >= row["log_peak_bytes"]
    assert size - failing <= min(max(size // 100, 256), 64 << 20)
    assert _failures(size, resource) == 0
    assert _failures(size // 10 * 9, resource) > 0


@pytest.mark.parametrize("trace", ["transformer_training", "random_10k_1mib"])
@pytest.mark.parametrize("resource", ["simulated", "pool", "binning", "arena", "fixed_size"])
def test_fit_on_the_small_shipped_logs(trace: str, resource: str) -> None:
    log = str(traces.path(trace))
    (fit,) = _rrmm.fit_logs([log], [resource])
    size, failing = fit["device_bytes"], fit["failing_bytes"]
    if resource == "fixed_size" and trace != "random_10k_1mib":
        # Requests above 1 MiB: no fixed-size device serves them.
        assert size is None and fit["reason"] is not None
        assert "above its largest block" in fit["reason"]
        return
    assert size is not None and failing is not None, fit
    (row,) = _rrmm.replay_logs([log], [resource], simulate=size, repeat=1)
    assert size >= row["log_peak_bytes"]
    assert size - failing <= min(max(size // 100, 256), 64 << 20)
    assert row["failed_allocations"] == 0
    (below,) = _rrmm.replay_logs([log], [resource], simulate=size // 10 * 9, repeat=1)
    assert (below["failed_allocations"] or 0) > 0
    if resource in ("pool", "binning"):
        assert fit["initial_pool_size"] is not None and "initial" in (fit["setup"] or "")
    if resource == "arena":
        assert fit["arena_size"] is not None
        assert (fit["setup"] or "").startswith("global arena of")


def test_fit_says_no_fixed_size_device_serves_requests_above_its_block() -> None:
    (fit,) = _rrmm.fit_logs([LOG], ["fixed_size"])
    assert fit["device_bytes"] is None
    assert fit["reason"] is not None and "above its largest block" in fit["reason"]
