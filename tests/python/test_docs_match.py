"""The docs say what the program does (issues 31 and 39): every call signature that docs/api.md
writes out for a Python function of rrmm names its parameters in order, with their defaults, as
``inspect.signature`` sees them; every public name and parameter is in docs/api.md; the install
advice names extras that pyproject.toml has; Cargo.toml and pyproject.toml give one repository
address, the one the README's Rust dependency uses; the CLI's subcommands each have a
description."""

from __future__ import annotations

import ast
import enum
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


# ---------------------------------------------------------------------------------------------
# Every public name is in docs/api.md (issue 39: it missed FallbackResourceAdaptor,
# release_caches, cache_limit=, host_memory= and more): generated from the modules' __all__ and
# the callables' signatures, so a name added to the package without a line in api.md fails here.

PUBLIC_MODULES = ["rrmm", "rrmm.mr", "rrmm.mr.experimental", "rrmm.statistics"]
#: Parameters api.md documents once for every callable that takes them, with where it says so.
DOCUMENTED_ONCE = {"upstream": "`upstream=` accepted where RMM takes `upstream_mr`"}


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")


def api_items(text: str) -> list[str]:
    """docs/api.md cut into items: a heading, a table row, a bullet with its indented
    continuation lines, or a paragraph."""
    items: list[str] = []
    for line in text.splitlines():
        starts = line.startswith(("#", "|", "- ")) or not items or not items[-1]
        if not line.strip():
            items.append("")
        elif starts or not line.startswith(" ") and items[-1].startswith(("#", "|", "- ")):
            items.append(line)
        else:
            items[-1] += "\n" + line
    return [item for item in items if item]


def public_names() -> list[tuple[str, str, object]]:
    import importlib

    names = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            try:
                obj = getattr(module, name)
            except ImportError:  # a framework hook that needs its framework: the name only
                obj = None
            names.append((module_name, name, obj))
    return names


def _parameters(obj: object) -> list[str]:
    if obj is None or not callable(obj) or inspect.ismodule(obj):
        return []
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return []  # level_enum(value): Enum's own call
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind not in variadic]


def undocumented(text: str) -> list[str]:
    """What docs/api.md (``text``) does not mention: each public name, as a word anywhere; each
    parameter of a public callable, as a word in an item that names the callable."""
    items = api_items(text)
    missing = []
    for module, name, obj in public_names():
        if not _word(name).search(text):
            missing.append(f"{module}.{name}")
            continue
        about = "\n".join(item for item in items if _word(name).search(item))
        for parameter in _parameters(obj):
            if parameter in DOCUMENTED_ONCE and DOCUMENTED_ONCE[parameter] in text:
                continue
            if not _word(parameter).search(about):
                missing.append(f"{module}.{name}({parameter}=)")
    return missing


def test_every_public_name_and_parameter_is_in_api_md():
    text = API.read_text()
    assert len(public_names()) > 60  # the check reads the modules it means to
    missing = undocumented(text)
    assert not missing, "docs/api.md does not mention:\n" + "\n".join(missing)


def test_the_api_check_finds_a_missing_name_and_a_missing_parameter():
    text = API.read_text()
    assert "rrmm.mr.release_caches" in undocumented(_word("release_caches").sub("x", text))
    without = "\n".join(line.replace("host_memory", "host") for line in text.splitlines())
    assert "rrmm.mr.SimulatedMemoryResource(host_memory=)" in undocumented(without)
    assert api_items("# a\n- b\n  c\n| d |\n\ne\nf\n") == ["# a", "- b\n  c", "| d |", "e\nf"]


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


def test_one_repository_address_and_the_readme_depends_on_it():
    # Issue 39: Cargo.toml and pyproject.toml gave different addresses, and the README's
    # `rrmm = "0.1"` could not resolve (the crate is not on crates.io).
    package = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    address = package["repository"]
    assert address.startswith("https://") and not address.endswith(("/", ".git")), address
    assert urls["Repository"] == address and urls["Homepage"] == package.get("homepage", address)
    assert urls["Issues"] == f"{address}/issues"
    section = (ROOT / "README.md").read_text().split("\n## Rust\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    assert block, "README, Rust: no dependency block"
    assert tomllib.loads(block.group(1))["dependencies"]["rrmm"] == {"git": address}
    assert "not on crates.io" in section


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
