"""The README says what the program does (issues 31 and 39): its no-GPU Python example runs as
written, and the main job's command ("The two commands") prints the figures of the README's
table. The whole no-GPU path on a fresh clone and venv is ``scripts/readme_check.py``, run by
``.ci/run``; every Python block as a script is ``test_docs_scripts.py``.

The replay's figures are compared one by one, each by its name (``pool frag@end``, ``header``):
bytes, counts and ratios exactly (the replay runs on simulated memory: they are the same on any
machine), times within the noise the README states for them:

- ``ns/event``: within a factor of ``TIME_FACTOR`` either way (a run on this 2-core machine moves
  by 1.3x, a busy machine runs everything 2-4x slower);
- ``spread`` and the repetition counts of the ``timings:`` line: not compared. The spread is the
  interquartile range over the median of the timed repetitions (3% to 120% in runs of the same
  build on the same machine); the counts are how many repetitions fit in the timed half
  second. Both are facts about the machine's load, not about rrmm.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TIME_FACTOR = 5.0
TIMED = "ns/event"
UNCOMPARED = {"spread"}
REPETITIONS = re.compile(r"(median of )([0-9/]+)( repetition)")


def readme_replay(text: str | None = None) -> tuple[list[str], str]:
    """The main job's ``rrmm replay`` arguments and the output the README shows for them."""
    section = (text or README.read_text()).split("## The two commands", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    shown = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert command and shown, "The two commands: no sh block or no text block"
    args = shlex.split(command.group(1).split("/rrmm replay ", 1)[1])
    return ["replay", *args], shown.group(1)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _table(lines: list[str]) -> tuple[int, int]:
    """Where the table is: the index of its column names and one past its last row."""
    rule = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+( +-+)+", line))
    end = rule + 1
    while end < len(lines) and lines[end][:1] not in ("", " "):
        end += 1
    return rule - 1, end


def _cells(row: str, spans: list[tuple[int, int]]) -> list[str]:
    # The first column is left-aligned, the others right-aligned under their rule.
    cells, start = [], 0
    for column, (_, end) in enumerate(spans):
        last = column == len(spans) - 1
        cells.append((row[start:] if last else row[start:end]).strip())
        start = end
    return cells


def _rows(lines: list[str]) -> tuple[list[str], dict[str, dict[str, str]], list[str]]:
    names_at, end = _table(lines)
    spans = [m.span() for m in re.finditer(r"-+", lines[names_at + 1])]
    names = _cells(lines[names_at], spans)
    rows = {}
    for row in lines[names_at + 2 : end]:
        cells = _cells(row, spans)
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return names, rows, lines[:names_at] + lines[end:]


def _file_name(word: str) -> str:
    """A path as its file's name: the command says where it wrote a file in full
    (``plot written to /home/you/rrmm/replay.png``), which differs from machine to machine."""
    return os.path.basename(word) if os.sep in word else word


def _label(line: str) -> str:
    head = line.strip().split(":", 1)[0].strip("( ")
    return "header" if head.endswith((".csv", ".gz")) else head


def _number(cell: str) -> float:
    return float(cell.rstrip("%!"))


def compare_replay_output(shown: str, printed: str) -> list[str]:
    """Every figure of ``shown`` (the README's block) against ``printed`` (the command's
    output); one line per figure that differs, naming it."""
    problems: list[str] = []
    want, got = _lines(shown), _lines(printed)
    want_names, want_rows, want_rest = _rows(want)
    got_names, got_rows, got_rest = _rows(got)
    if want_names != got_names:
        problems.append(f"columns: the README shows {want_names}, the command prints {got_names}")
    if list(want_rows) != list(got_rows):
        problems.append(f"rows: the README shows {list(want_rows)}, the command prints "
                        f"{list(got_rows)}")
    for resource, row in want_rows.items():
        for column, value in row.items():
            other = got_rows.get(resource, {}).get(column)
            if other is None or column in UNCOMPARED:
                continue
            name = f"{resource} {column}"
            if column == TIMED:
                ratio = _number(other) / _number(value)
                if not 1 / TIME_FACTOR <= ratio <= TIME_FACTOR:
                    problems.append(f"{name}: the README shows {value}, the command prints "
                                    f"{other}: beyond the factor of {TIME_FACTOR:g} the README "
                                    f"allows times")
            elif value != other:
                problems.append(f"{name}: the README shows {value}, the command prints {other}")
    if len(want_rest) != len(got_rest):
        problems.append(f"lines outside the table: the README shows {len(want_rest)}, the "
                        f"command prints {len(got_rest)}:\n  " + "\n  ".join(got_rest))
    for line, other in zip(want_rest, got_rest, strict=False):
        masked = [[_file_name(w) for w in REPETITIONS.sub(r"\1N\3", x).split()]
                  for x in (line, other)]
        if masked[0] != masked[1]:
            at = next((i for i, (a, b) in enumerate(zip(*masked, strict=False)) if a != b),
                      min(map(len, masked)))
            word = [m[at] if at < len(m) else "(nothing)" for m in masked]
            problems.append(f"{_label(line)} line, word {at + 1}: the README shows {word[0]!r}, "
                            f"the command prints {word[1]!r}\n  README:  {line}\n  printed: "
                            f"{other}")
    return problems


def run_readme_replay(cwd: Path) -> str:
    args, _ = readme_replay()
    if importlib.util.find_spec("matplotlib") is None:  # the figures do not depend on the plot
        at = args.index("--plot")
        del args[at : at + 2]
    run = subprocess.run([sys.executable, "-m", "rrmm", *args], cwd=cwd, capture_output=True,
                         text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_the_main_job_prints_the_figures_the_readme_shows(tmp_path):
    args, shown = readme_replay()
    assert args[:2] == ["replay", "transformer_training"] and "--simulate" in args, args
    printed = run_readme_replay(tmp_path)
    if "plot written" not in printed:  # no matplotlib here: run without --plot
        shown = "\n".join(x for x in shown.splitlines() if not x.startswith("plot written"))
    else:
        assert (tmp_path / "replay.png").stat().st_size > 10_000
    problems = compare_replay_output(shown, printed)
    assert not problems, "README.md, The two commands, differs from the command:\n" + "\n".join(
        problems)


def _alter(shown: str, old: str, new: str) -> str:
    assert shown.count(old) == 1, old
    return shown.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("0.439       0\n", "0.666       0\n",
         "pool frag@end: the README shows 0.666, the command prints 0.439"),
        ("2.00 GiB      1.64", "2.00 GiB      1.65", "pool overhead"),
        ("41.77 MiB", "41.78 MiB", "binning waste"),
        ("0.356", "0.365", "binning frag@peak"),
        ("31.48 MiB      0.000     0.000       0", "31.48 MiB      0.000     0.000       1",
         "simulated failed"),
        ("21949 events", "21948 events", "header line, word 2"),
        ("x 128 blocks", "x 64 blocks", "binning line"),
        ("charged in 2 MiB pages", "charged in 4 MiB pages", "simulated line"),
        ("simulated     133.7", "simulated    1337.0", "simulated ns/event"),
    ],
)
def test_the_check_fails_on_a_changed_figure_and_names_it(old, new, named):
    _, shown = readme_replay()
    assert compare_replay_output(shown, shown) == []
    problems = compare_replay_output(_alter(shown, old, new), shown)
    assert len(problems) == 1 and named in problems[0], problems


def test_the_check_leaves_the_timing_noise_alone():
    _, shown = readme_replay()
    noisy = _alter(_alter(shown, "     5%   2.00 GiB      1.64", "   120%   2.00 GiB      1.64"),
                   "median of 133/239/262", "median of 93/191/1940")
    noisy = _alter(noisy, "pool           58.6", "pool          117.0")  # 2x slower
    assert compare_replay_output(noisy, shown) == []


def test_the_check_fails_on_a_missing_or_extra_line():
    _, shown = readme_replay()
    fewer = "\n".join(x for x in shown.splitlines() if not x.startswith("  binning:"))
    assert any("lines outside the table" in p for p in compare_replay_output(fewer, shown))
    fewer_rows = "\n".join(x for x in shown.splitlines() if not x.startswith("binning "))
    assert any(p.startswith("rows:") for p in compare_replay_output(fewer_rows, shown))


def test_the_readme_explains_the_figures_its_table_shows():
    # The prose under the table quotes its figures: they move with it.
    _, shown = readme_replay()
    _, rows, _ = _rows(_lines(shown))
    text = " ".join(README.read_text().split())
    pool, binning = rows["pool"], rows["binning"]

    def largest(frag: str) -> int:
        return round(100 * (1 - float(frag)))

    assert (f"the pool's {pool['frag@end']} at the end means its largest free block is "
            f"{largest(pool['frag@end'])}% of its free memory (binning's {binning['frag@end']}: "
            f"{largest(binning['frag@end'])}%)") in text
    assert f"the pool held {pool['overhead']}x what the log needed, binning " \
           f"{binning['overhead']}x" in text


def test_the_no_gpu_python_example_runs_as_written(tmp_path):
    text = README.read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL)
                   if "SimulatedMemoryResource" in b)
    script = tmp_path / "example.py"
    script.write_text(example)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1].startswith("hint: fragmented"), lines
    assert int(lines[0].split()[0]) == 2 << 30


def test_the_python_section_says_it_needs_a_gpu_and_points_to_simulated_memory():
    section = README.read_text().split("## Python", 1)[1].split("\n## ", 1)[0]
    assert "needs an NVIDIA GPU" in section and "SimulatedMemoryResource" in section


#: What rrmm does beyond RMM, as the README's headings name it, with what a snippet for a GPU and
#: one that runs on any machine must each show (issue 50): every section keeps both.
BEYOND_RMM = {
    "### Sleep and wake, every address kept": (["rrmm.sleep("], ["rrmm.sleep(", "pageable_host"]),
    "### Spill to host memory, and promotion back": (
        ["spill_to_host", "promote("], ["spill_to_host", "device_capacity", "promote("]),
    "### One GPU, many processes": (["share_gpu", "rrmm.shared_gpu"],
                                    ["shared=", "RRMM_SHARE_GPU", "shared_gpu.history"]),
    "### One copy, many processes": (["shareable=True", "publish(", "rrmm.share.attach"],
                                     ["shareable=True", "pageable_host", "publish("]),
    "### The engines' sleep APIs": (["torch_memory_saver"],
                                    ["TorchMemorySaver(make_pool", "CuMemAllocator(make_pool"]),
    "## Dask": (["RRMMSetup", "share_gpu"], ["RRMMSetup", "simulate="]),
}
SWITCHES = ("RRMM_AS_TORCH_MEMORY_SAVER", "RRMM_AS_VLLM_CUMEM", "RRMM_AS_RMM", "RRMM_SHARE_GPU")


def _section(text: str, heading: str) -> str | None:
    level = heading.split(" ", 1)[0]
    start = text.find("\n" + heading + "\n")
    if start < 0:
        return None
    body = text[start + len(heading) + 2:]
    ends = [i for i in (body.find("\n## "), body.find("\n" + level + " ")) if i >= 0]
    return body[: min(ends)] if ends else body


def beyond_rmm_problems(text: str) -> list[str]:
    """What the README lacks of the snippets ``BEYOND_RMM`` asks for, one line each, naming the
    section and the snippet."""
    problems = []
    for heading, (gpu_needs, cpu_needs) in BEYOND_RMM.items():
        section = _section(text, heading)
        if section is None:
            problems.append(f"README.md has no section {heading!r}")
            continue
        gpu, cpu = [], []
        for match in re.finditer(r"```python\n(.*?)```", section, re.DOTALL):
            before = section[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            (gpu if "script needs: gpu" in before else cpu).append(match.group(1))
        for kind, found, needs in (("GPU", gpu, gpu_needs), ("no-GPU", cpu, cpu_needs)):
            if not found:
                problems.append(f"{heading!r}: no {kind} snippet")
                continue
            for need in needs:
                if not any(need in block for block in found):
                    problems.append(f"{heading!r}: no {kind} snippet shows {need!r}")
    switches = _section(text, "### The engines' switches") or ""
    problems += [f"'### The engines' switches' does not name {name}" for name in SWITCHES
                 if name not in switches]
    if "not on PyPI" not in text.split("## The two commands", 1)[0]:
        problems.append("the README's opening does not say that rrmm is not on PyPI")
    return problems


def test_the_readme_shows_each_thing_beyond_rmm_with_a_gpu_and_a_no_gpu_snippet():
    problems = beyond_rmm_problems(README.read_text())
    assert not problems, "README.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("heading", list(BEYOND_RMM))
def test_the_snippet_check_fails_on_a_removed_snippet(heading):
    text = README.read_text()
    section = _section(text, heading)
    assert section is not None
    last = list(re.finditer(r"```python\n(.*?)```", section, re.DOTALL))[-1]
    removed = text.replace(section, section[: last.start()] + section[last.end():])
    problems = beyond_rmm_problems(removed)
    assert problems and all(heading in p for p in problems), problems


def test_help_rrmm_points_to_what_rrmm_adds():
    import rrmm

    doc = rrmm.__doc__ or ""
    for name in ("README", "not on PyPI", "rrmm.sleep()", "spill_to_host", "rrmm.shared_gpu",
                 "shared=", "rrmm.compat.torch_memory_saver", "rrmm.compat.vllm_cumem",
                 "rrmm.dask", *SWITCHES[:3]):
        assert name in doc, name


def test_compat_and_dask_are_attributes_imported_on_first_access():
    # A fresh process: importing rrmm imports no framework, and the two subpackages are
    # attributes once asked for.
    code = ("import sys, rrmm\n"
            "heavy = {'cupy', 'torch', 'numba', 'distributed', 'dask', 'rrmm.dask', 'rrmm.compat'}\n"
            "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
            "assert rrmm.compat.__name__ == 'rrmm.compat'\n"
            "import rrmm.compat.torch_memory_saver, rrmm.compat.vllm_cumem\n"
            "assert 'torch' not in sys.modules\n"
            "try:\n    import distributed\nexcept ImportError:\n    raise SystemExit(0)\n"
            "assert rrmm.dask.RRMMSetup.__module__ == 'rrmm.dask'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0, run.stderr
