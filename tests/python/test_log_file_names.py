"""RMM-Python's allocation-log file naming (``rrmm._logging.log_file_for_device``)."""

from __future__ import annotations

import pytest
from rrmm._logging import log_file_for_device


@pytest.mark.parametrize(
    ("name", "device", "expected"),
    [
        ("rmm_log.csv", 0, "rmm_log.dev0.csv"),
        ("/a.b/log", 3, "/a.b/log.dev3"),
        ("x.tar.gz", 1, "x.tar.dev1.gz"),
        (".hidden", 1, ".hidden.dev1"),
        ("d/..x", 1, "d/..x.dev1"),
        (b"bytes.csv", 2, "bytes.dev2.csv"),
    ],
)
def test_dev_suffix_goes_before_the_extension(name, device, expected):
    assert log_file_for_device(name, device) == expected


def test_environment_names_the_file_when_no_name_is_given(monkeypatch):
    monkeypatch.setenv("RMM_LOG_FILE", "env.csv")
    assert log_file_for_device(None, 1) == "env.dev1.csv"
    monkeypatch.delenv("RMM_LOG_FILE")
    with pytest.raises(ValueError, match="RMM_LOG_FILE"):
        log_file_for_device(None, 0)
