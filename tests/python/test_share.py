"""rrmm.share across two real processes, on memory files (the CPU stand-in for device memory):
bytes written by the exporter read bit-exact by an importer, names rebuilt as arrays through
``__array_interface__``, and a free that waits for the importer that holds the name."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import rrmm.share

IMPORTER = textwrap.dedent(
    """
    import hashlib, sys
    import numpy as np
    import rrmm.share

    directory, name = sys.argv[1], sys.argv[2]
    imp = rrmm.share.attach("exp", directory=directory)
    face = imp.resolve(name)

    class View:
        __array_interface__ = {
            "shape": face["shape"], "typestr": face["typestr"], "data": face["data"],
            "version": 3,
        }

    array = np.asarray(View())
    print("HASH", hashlib.sha256(array.tobytes()).hexdigest(), flush=True)
    print("SAME", imp.read(name) == array.tobytes(), flush=True)
    print("READONLY", face["data"][1], not array.flags.writeable, flush=True)
    print("NAMES", ",".join(imp.names()), flush=True)
    print("HELD", flush=True)
    sys.stdin.readline()
    """
)


def _importer(directory: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", IMPORTER, str(directory), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _lines_until(proc: subprocess.Popen[str], word: str) -> dict[str, str]:
    assert proc.stdout is not None
    seen: dict[str, str] = {}
    for line in proc.stdout:
        key, _, rest = line.strip().partition(" ")
        seen[key] = rest
        if key == word:
            return seen
    raise AssertionError(f"the importer ended before {word}: {seen}")


def _wait_for(exp: rrmm.share.Exporter, key: str, value: int) -> None:
    deadline = time.monotonic() + 10
    while exp.figures()[key] != value:
        assert time.monotonic() < deadline, exp.figures()
        time.sleep(0.01)


@pytest.fixture
def exporter(tmp_path: Path) -> rrmm.share.Exporter:
    exp = rrmm.share.publish("exp", directory=tmp_path)
    yield exp
    exp.close()


def test_an_importer_process_reads_the_exporters_array_bit_exact(
    exporter: rrmm.share.Exporter, tmp_path: Path
) -> None:
    weights = np.random.default_rng(7).standard_normal(100_000).astype("<f4")
    seg = exporter.add_segment(1 << 20)
    exporter.write(seg, 4096, weights.tobytes())
    exporter.publish("w", seg, 4096, weights.nbytes, "<f4", weights.shape, readonly=True)
    exporter.publish("other", seg, 0, 16)
    proc = _importer(tmp_path, "w")
    seen = _lines_until(proc, "HELD")
    assert seen["HASH"] == hashlib.sha256(weights.tobytes()).hexdigest()
    assert seen["SAME"] == "True"
    assert seen["READONLY"] == "True True"
    assert seen["NAMES"] == "other,w"
    assert exporter.figures()["leases"] == 1
    proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    _wait_for(exporter, "leases", 0)


def test_a_free_waits_for_the_importer_process_that_holds_the_name(
    exporter: rrmm.share.Exporter, tmp_path: Path
) -> None:
    seg = exporter.add_segment(1 << 16)
    exporter.write(seg, 0, b"shared")
    exporter.publish("a", seg, 0, 6)
    proc = _importer(tmp_path, "a")
    _lines_until(proc, "HELD")
    assert exporter.free("a") is False, "held by the importer: the free waits"
    assert exporter.figures()["deferred_frees"] == 1
    assert exporter.names() == []
    proc.communicate("\n", timeout=30)
    _wait_for(exporter, "deferred_frees", 0)
    assert exporter.figures()["frees_after_wait"] == 1


def test_names_errors_and_adoption_in_one_process(tmp_path: Path) -> None:
    exp = rrmm.share.publish("old", directory=tmp_path)
    seg = exp.add_segment(1 << 16)
    exp.write(seg, 0, b"kept")
    exp.publish("k", seg, 0, 4)
    with pytest.raises(ValueError, match="exported already"):
        exp.publish("k", seg, 0, 4)
    with pytest.raises(ValueError, match="pass segment"):
        exp.publish("far", seg, 1 << 16, 4)
    imp = rrmm.share.attach("old", directory=tmp_path)
    with pytest.raises(KeyError):
        imp.resolve("missing")
    assert imp.read("k") == b"kept"
    exp.close()
    assert imp.read("k") == b"kept", "the exporter is gone; the map is not"
    new = rrmm.share.publish("new", directory=tmp_path, accept_adoption=True)
    assert imp.hand_back(new.path) == (1, 1)
    assert new.names() == ["k"]
    other = rrmm.share.attach(path=new.path)
    assert other.read("k") == b"kept"
    with pytest.raises(TypeError):
        rrmm.share.attach()
    imp.close()
    other.close()
    new.close()
