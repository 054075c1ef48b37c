#!/usr/bin/env python3
"""Records the sleep-mode API of a vLLM release from its wheel, without importing vLLM:
``CuMemAllocator``'s calls and attributes, what other vLLM modules import from
``vllm.device_allocator.cumem``, ``DEFERRABLE_TAGS``, ``SleepModeBackend``'s calls and states,
and ``SleepModeBackendFactory.register_backend``. ``tests/python/test_vllm_sleep_mode.py``
compares rrmm's classes with the record (CI has no vLLM).

Usage: ``python3 scripts/vllm_signatures.py vllm-X.Y.Z-*.whl > tests/python/data/vllm_signatures.json``
(``pip download --no-deps vllm==X.Y.Z`` gives the wheel).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

CUMEM = "vllm/device_allocator/cumem.py"
PACKAGE = "vllm/device_allocator/__init__.py"
BACKEND = "vllm/device_allocator/sleep_mode_backend.py"


def decorators(node: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d).rsplit(".", 1)[-1] for d in node.decorator_list]


def params(node: ast.FunctionDef) -> list[list[Any]]:
    """Each parameter as ``[name, kind, default source or None]`` (kinds as ``inspect``'s)."""
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += a.defaults
    out = [[p.arg, "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD",
            None if d is None else ast.unparse(d)]
           for i, (p, d) in enumerate(zip(positional, defaults, strict=True))]
    if a.vararg is not None:
        out.append([a.vararg.arg, "VAR_POSITIONAL", None])
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append([p.arg, "KEYWORD_ONLY", None if d is None else ast.unparse(d)])
    if a.kwarg is not None:
        out.append([a.kwarg.arg, "VAR_KEYWORD", None])
    return out


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def describe_class(cls: ast.ClassDef) -> dict[str, Any]:
    """Public methods (and ``__init__``), class attributes with literal values, and the public
    attributes ``__init__`` sets on ``self``."""
    methods: dict[str, Any] = {}
    attributes: dict[str, Any] = {}
    instance: list[str] = []
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and (node.name == "__init__"
                                                  or not node.name.startswith("_")):
            methods[node.name] = {"decorators": decorators(node), "params": params(node)}
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            for sub in ast.walk(node):
                for target in getattr(sub, "targets", [getattr(sub, "target", None)]):
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self" and not target.attr.startswith("_")):
                        instance.append(target.attr)
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and node.value is not None:
                attributes[target.id] = ast.literal_eval(node.value)
    return {"methods": methods, "class_attributes": attributes,
            "instance_attributes": sorted(set(instance))}


def literal(tree: ast.Module, name: str) -> Any:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name:
            return node.value
    raise KeyError(name)


def imported_from(sources: dict[str, str], module: str) -> list[str]:
    """The names other modules of the release import from ``module``."""
    names: set[str] = set()
    for path, text in sources.items():
        if path == module.replace(".", "/") + ".py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names.update(a.name for a in node.names)
    return sorted(names)


def record(wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as z:
        sources = {n: z.read(n).decode() for n in z.namelist()
                   if n.startswith("vllm/") and n.endswith(".py")}
    version = re.match(r"vllm-([^-]+)-", wheel.name)
    cumem, package, backend = (ast.parse(sources[p]) for p in (CUMEM, PACKAGE, BACKEND))
    state = literal(backend, "SleepModeState")
    assert isinstance(state, ast.Subscript)
    factory = find_class(backend, "SleepModeBackendFactory")
    register = next(n for n in factory.body
                    if isinstance(n, ast.FunctionDef) and n.name == "register_backend")
    return {
        "vllm": version.group(1) if version else wheel.name,
        "wheel": wheel.name,
        "vllm.device_allocator.cumem": {
            "imported_by_vllm": imported_from(sources, "vllm.device_allocator.cumem"),
            "CuMemAllocator": describe_class(find_class(cumem, "CuMemAllocator")),
        },
        "vllm.device_allocator": {
            "DEFERRABLE_TAGS": ast.literal_eval(literal(package, "DEFERRABLE_TAGS")),
        },
        "vllm.device_allocator.sleep_mode_backend": {
            "SleepModeState": list(ast.literal_eval(state.slice)),
            "SleepModeBackend": describe_class(find_class(backend, "SleepModeBackend")),
            "SleepModeBackendFactory.register_backend": {
                "decorators": decorators(register), "params": params(register)},
        },
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    json.dump(record(Path(sys.argv[1])), sys.stdout, indent=1)
    print()
