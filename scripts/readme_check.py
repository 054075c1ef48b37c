#!/usr/bin/env python3
"""Follows the README's no-GPU commands as a newcomer would: a fresh clone of this repository
(its committed tree), a fresh venv, the wheel that ``.ci/run`` built from the same tree in
place of the README's ``pip install '.[plot]'`` (no second build), then, taken from the README
itself: the main job's command, the snapshot viewer's command and the no-GPU Python example.

Usage: ``python3 scripts/readme_check.py WHEEL`` (run by ``.ci/run``). Exits non-zero, naming
the step, when a command fails or its output is not what the README shows.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def blocks(readme: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", readme, re.DOTALL)


def step(name: str, command: list[str] | str, cwd: Path, **kwargs: object) -> str:
    started = time.monotonic()
    shell = isinstance(command, str)
    result = subprocess.run(command, cwd=cwd, shell=shell, capture_output=True, text=True,
                            check=False, **kwargs)  # type: ignore[call-overload]
    took = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"readme_check: {name} failed ({result.returncode}):\n{result.stdout}\n"
                 f"{result.stderr}")
    print(f"  ok  {name} ({took:.1f}s)")
    return result.stdout


def main() -> None:
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".whl"):
        sys.exit("usage: readme_check.py WHEEL")
    wheel = Path(sys.argv[1]).resolve()
    with tempfile.TemporaryDirectory(prefix="rrmm-readme-") as tmp:
        clone = Path(tmp) / "rrmm"
        step("git clone (fresh)", ["git", "clone", "-q", "--depth", "1", f"file://{ROOT}",
                                   str(clone)], Path(tmp))
        readme = (clone / "README.md").read_text()
        # The two commands: the first shell block sets up a venv and runs the main job.
        main_job = blocks(readme, "sh")[0].strip()
        assert "pip install '.[plot]'" in main_job, main_job
        main_job = main_job.replace("'.[plot]'", shlex.quote(f"{wheel}[plot]"))
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        out = step("the main job (README: The two commands)", main_job, clone, env=env)
        lines = out.splitlines()  # pip's lines first, then the report
        assert any(line.startswith("transformer_training.csv.gz: 21949 events")
                   for line in lines), out
        assert any(line.split()[:1] == ["simulated"] for line in lines), out
        assert (clone / "replay.png").stat().st_size > 10_000
        # The viewer's command, as the README writes it.
        viewer = next(b.strip() for b in blocks(readme, "sh") if "snapshot view" in b)
        out = step("the snapshot viewer", viewer, clone, env=env)
        page = (clone / "transformer.html").read_text()
        assert "21949 allocation/free event(s)" in page
        # The Python example that runs on any machine.
        example = next(b for b in blocks(readme, "python") if "SimulatedMemoryResource" in b)
        out = step("the no-GPU Python example", [str(clone / ".venv" / "bin" / "python"), "-c",
                                                 example], clone, env=env)
        assert "hint: fragmented" in out, out
        step("python -m rrmm info", [str(clone / ".venv" / "bin" / "python"), "-m", "rrmm",
                                     "info"], clone, env=env)
    print("readme_check: the README's no-GPU commands work on a fresh clone")


if __name__ == "__main__":
    main()
