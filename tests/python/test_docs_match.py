"""The docs say what the program does (issue 31): every call signature that docs/api.md writes
out for a Python function of rrmm names its parameters in order, with their defaults, as
``inspect.signature`` sees them; the install advice names extras that pyproject.toml has; the
CLI's subcommands each have a description."""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from pathlib import Path

import pytest
import rrmm
import rrmm.mr
import rrmm.statistics

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"
CALL = re.compile(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
MODULES = [rrmm, rrmm.mr, rrmm.statistics]


def _split(params: str) -> list[str]:
    out, depth, current = [], 0, ""
    for ch in params:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        out.append(current.strip())
    return out


def documented_calls() -> list[tuple[int, str, str]]:
    calls = []
    for number, line in enumerate(API.read_text().splitlines(), start=1):
        for match in CALL.finditer(line):
            name, params = match.groups()
            if "[," in params or "..." in params or not params.strip():
                continue  # "[, mr]" notation, elisions and bare calls say nothing to check
            if line[: match.start()].count("`") % 2:
                continue  # a call in backticks is an example of use, not the signature
            calls.append((number, name, params))
    return calls


def _function(name: str):
    for module in MODULES:
        try:
            obj = getattr(module, name, None)
        except ImportError:  # a lazily imported framework hook
            continue
        if inspect.isfunction(obj):
            return obj
    return None


def test_the_signatures_written_in_api_md_are_the_real_ones():
    checked = 0
    problems = []
    for number, name, params in documented_calls():
        func = _function(name)
        if func is None:
            continue
        real = inspect.signature(func).parameters
        written = _split(params)
        names = []
        for item in written:
            head, _, default = item.partition("=")
            pname = head.split(":")[0].strip()
            if pname == "*":
                continue
            names.append(pname.lstrip("*"))
            if default and pname.lstrip("*") in real:
                value = real[pname.lstrip("*")].default
                try:
                    literal = ast.literal_eval(default.strip())
                except (ValueError, SyntaxError):
                    continue  # a name such as DEFAULT_STREAM
                if literal != value:
                    problems.append(f"api.md:{number}: {name}: {pname}={default.strip()}, "
                                    f"but the default is {value!r}")
        real_names = [p.name for p in real.values()]
        if names != real_names:
            problems.append(f"api.md:{number}: {name}({', '.join(names)}) but the function "
                            f"takes ({', '.join(real_names)})")
        checked += 1
    assert checked >= 3, "the check found too few signatures in docs/api.md to mean anything"
    assert not problems, "\n".join(problems)


def test_reinitialize_is_documented_with_every_parameter():
    # Issue 31: docs/api.md gave reinitialize without pinned_pool_size and without the kinds
    # pool_allocator takes.
    text = API.read_text()
    line = next(x for x in text.splitlines() if x.startswith("- reinitialize("))
    for parameter in inspect.signature(rrmm.reinitialize).parameters:
        assert parameter in line, parameter
    from rrmm import _stack

    for kind in _stack.kinds():
        if kind != "simulated":
            assert f'"{kind}"' in text, kind
    with pytest.raises(ValueError, match="simulated memory needs a size"):
        rrmm.reinitialize(pool_allocator="simulated")


def test_install_advice_names_extras_that_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    pytest.importorskip("distributed")  # rrmm.dask needs it (the GPU image has none)
    import rrmm.dask

    assert "'.[dask]'" in rrmm.dask.INSTALL_HINT and "dask" in extras
    assert any(req.startswith("distributed") for req in extras["dask"])
    assert any(req.startswith("matplotlib") for req in extras["plot"])
    sources = "\n".join(p.read_text() for p in (ROOT / "python" / "rrmm").rglob("*.py"))
    for extra in re.findall(r"rrmm\[(\w+)\]", sources + (ROOT / "README.md").read_text()):
        assert extra in extras, extra


def test_every_subcommand_has_a_description(capsys):
    from rrmm.__main__ import main

    for argv in (["info"], ["replay"], ["snapshot"], ["snapshot", "view"]):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--help"])
        assert exit_.value.code == 0
        text = capsys.readouterr().out
        body = text.split("\n\n", 2)
        assert len(body) >= 2 and not body[1].startswith(("positional", "options")), (argv, text)


def test_the_missing_cupy_error_says_each_thing_once():
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed")
    from rrmm.allocators.cupy import rmm_cupy_allocator

    with pytest.raises(ModuleNotFoundError) as error:
        rmm_cupy_allocator(8)
    message = str(error.value)
    assert message.startswith("No module named 'cupy'")
    assert message.count("needs") == 1 and message.count("No module named") == 1, message
