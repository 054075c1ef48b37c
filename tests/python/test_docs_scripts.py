"""Every ```python block of README.md and docs/*.md runs as a script (issue 39): saved to a file
and run with ``python file.py`` in a fresh process, as a reader who copies it would run it (a
block run in-process or with ``-c`` hides what a file needs, such as the ``__main__`` guard that
Dask's worker processes need).

The rule is written in the markdown, on the line before a block:

- ``<!-- not a script: WHY -->``: a fragment on purpose (a method of another project's test
  class, an elided example); never run, and the reason is the test's skip reason.
- ``<!-- script needs: gpu -->``: runs only where a CUDA driver and device are.

A block that imports CuPy, PyTorch, dask-cuda, Numba or distributed is skipped, with the reason,
where that package is missing (CI installs distributed; the GPU run's image lacks it). Every other block must run here, and every block that is not a fragment
must at least compile.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import gpu_available, gpu_skip_reason

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*(not a script|script needs):\s*(.*?)\s*-->\s*\Z")
#: The packages a block may need that the test environment may lack, by import name. CI's
#: environment has distributed (the `test` extra); the GPU run's image does not.
OPTIONAL = {"cupy": "CuPy", "torch": "PyTorch", "dask_cuda": "dask-cuda", "numba": "Numba",
            "distributed": "distributed"}
NEEDS = {"gpu"}


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence
    source: str
    fragment: str | None  # why it is not a script
    needs: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    text = document.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n")
        line = text.count("\n", 0, match.start()) + 1
        marker = MARKER.search(before.rsplit("\n", 1)[-1])
        fragment, needs = None, frozenset[str]()
        if marker and marker.group(1) == "not a script":
            fragment = marker.group(2)
            assert fragment, f"{document.name}:{line}: say why the block is not a script"
        elif marker:
            needs = frozenset(n.strip() for n in marker.group(2).split(","))
            assert needs <= NEEDS, f"{document.name}:{line}: unknown needs {needs - NEEDS}"
        found.append(Block(document, line, match.group(1), fragment, needs))
    return found


ALL = [b for d in DOCUMENTS for b in blocks(d)]


def imported(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_blocks_are_found():
    # README: the GPU example, the simulated-memory example, Dask, pinned memory;
    # which_setup.md: the short answer.
    assert len(ALL) >= 5, [b.name for b in ALL]
    assert sum(b.document.name == "README.md" for b in ALL) >= 4


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.name)
def test_the_block_runs_as_a_script(block: Block, tmp_path: Path):
    if block.fragment is not None:
        pytest.skip(f"not a script: {block.fragment}")
    compile(block.source, block.name, "exec")  # even where it cannot run
    for module in sorted(imported(block.source)):
        if module in OPTIONAL and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {OPTIONAL[module]}, which is not installed")
    if "gpu" in block.needs and not gpu_available():
        pytest.skip(f"needs a GPU: {gpu_skip_reason()}")
    script = tmp_path / (re.sub(r"\W", "_", block.name) + ".py")
    script.write_text(block.source)
    try:
        run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{block.name} did not finish in 300 s; stderr: {e.stderr!r}")
    assert run.returncode == 0, f"{block.name} as a script:\n{run.stdout}\n{run.stderr}"


def test_a_block_marked_as_a_fragment_says_why_and_is_not_run(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n<!-- not a script: one method of a class -->\n```python\n"
                   "def f(self):\n    ...\n```\n\n```python\nprint(1)\n```\n")
    first, second = blocks(doc)
    assert first.fragment == "one method of a class" and first.line == 4
    assert second.fragment is None and second.needs == frozenset() and second.line == 9


def test_a_gpu_marker_is_read_and_an_unknown_need_refused(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- script needs: gpu -->\n```python\nimport cupy\n```\n")
    (block,) = blocks(doc)
    assert block.needs == {"gpu"} and imported(block.source) == {"cupy"}
    doc.write_text("<!-- script needs: tpu -->\n```python\npass\n```\n")
    with pytest.raises(AssertionError, match="unknown needs"):
        blocks(doc)
