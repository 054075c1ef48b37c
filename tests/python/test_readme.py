"""The README's no-GPU Python example runs as written (issue 31); the whole no-GPU path on a
fresh clone and venv is ``scripts/readme_check.py``, run by ``.ci/run``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_no_gpu_python_example_runs_as_written():
    text = README.read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL)
                   if "SimulatedMemoryResource" in b)
    run = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1].startswith("hint: fragmented"), lines
    assert int(lines[0].split()[0]) == 2 << 30


def test_the_python_section_says_it_needs_a_gpu_and_points_to_simulated_memory():
    section = README.read_text().split("## Python", 1)[1].split("\n## ", 1)[0]
    assert "needs an NVIDIA GPU" in section and "SimulatedMemoryResource" in section
