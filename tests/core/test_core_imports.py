"""The core is pure: every module under ``src/kallot/core`` imports only the standard library's
pure modules (no I/O, clock, randomness, threads or processes), numpy, the declared LP solver
(highspy) and other core modules. The AST of each module is walked, so imports inside functions
and ``TYPE_CHECKING`` blocks count too. import-linter's ``core-is-pure`` contract forbids a list
of known-bad packages; this test is the allow-list, so a new dependency has to be declared here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kallot.core

CORE = Path(kallot.core.__file__).parent

# Standard library modules that do no I/O, read no clock, draw no randomness and start nothing.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "contextlib",
        "copy",
        "dataclasses",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "math",
        "numbers",
        "operator",
        "re",
        "string",
        "types",
        "typing",
    }
)
# Modules of which only some names are pure: uuid's name-based (deterministic) UUIDs, not
# uuid1 (clock, MAC address) or uuid4 (randomness).
RESTRICTED = {
    "uuid": frozenset(
        {
            "UUID",
            "uuid3",
            "uuid5",
            "NAMESPACE_DNS",
            "NAMESPACE_URL",
            "NAMESPACE_OID",
            "NAMESPACE_X500",
        }
    ),
}
THIRD_PARTY = frozenset({"numpy", "highspy"})  # highspy: the declared LP solver (core.packing)


def _module_name(path: Path) -> str:
    rel = path.relative_to(CORE.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def violations(
    source: str, module: str = "kallot.core.example", is_package: bool = False
) -> list[str]:
    """Every import of ``source`` (the text of core module ``module``) outside the allow-list,
    as ``"line N: what"``."""
    tree = ast.parse(source)
    out: list[str] = []
    aliases: dict[str, str] = {}  # local name -> restricted module

    def check(line: int, name: str, imported: tuple[str, ...] = ()) -> None:
        top = name.split(".", maxsplit=1)[0]
        if top == "kallot":
            if name != "kallot.core" and not name.startswith("kallot.core."):
                out.append(f"line {line}: {name} (the core imports no shell)")
        elif top in RESTRICTED:
            bad = [n for n in imported if n not in RESTRICTED[top]]
            if bad:
                out.append(f"line {line}: {top}.{', '.join(bad)} (not a pure part of {top})")
        elif top not in PURE_STDLIB and top not in THIRD_PARTY:
            out.append(f"line {line}: {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(node.lineno, alias.name)
                if alias.name in RESTRICTED:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            check(
                node.lineno,
                _absolute(module, is_package, node),
                tuple(a.name for a in node.names),
            )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            out.append(f"line {node.lineno}: __import__ (imports are static in the core)")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            top = aliases[node.value.id]
            if node.attr not in RESTRICTED[top]:
                out.append(f"line {node.lineno}: {top}.{node.attr} (not a pure part of {top})")
    return out


def test_every_core_module_imports_only_pure_modules() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 50  # the walk found the core, not an empty directory
    found = {
        str(path.relative_to(CORE)): bad
        for path in files
        if (
            bad := violations(
                path.read_text(), _module_name(path), is_package=path.name == "__init__.py"
            )
        )
    }
    assert found == {}


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        pytest.param("import time\n", "line 1: time", id="a clock"),
        pytest.param(
            "def f():\n    from time import monotonic\n", "line 2: time", id="in a function"
        ),
        pytest.param("import logging\n", "line 1: logging", id="logging"),
        pytest.param("import random\n", "line 1: random", id="randomness"),
        pytest.param("import os.path\n", "line 1: os.path", id="os"),
        pytest.param("import importlib\n", "line 1: importlib", id="dynamic imports"),
        pytest.param("m = __import__('socket')\n", "line 1: __import__", id="__import__"),
        pytest.param("import scipy.optimize\n", "line 1: scipy.optimize", id="undeclared solver"),
        pytest.param(
            "from kallot.sim import clock\n", "line 1: kallot.sim (the core", id="a shell"
        ),
        pytest.param("from ..sim import clock\n", "line 1: kallot.sim (the core", id="relative"),
        pytest.param("import uuid\nuuid.uuid4()\n", "line 2: uuid.uuid4", id="uuid4"),
        pytest.param("from uuid import uuid1\n", "line 1: uuid.uuid1", id="uuid1"),
    ],
)
def test_the_walk_flags_impure_imports(source: str, flagged: str) -> None:
    found = violations(source, "kallot.core.example")
    assert len(found) == 1 and found[0].startswith(flagged), found


@pytest.mark.parametrize(
    "source",
    [
        "import numpy as np\nfrom numpy.typing import NDArray\n",
        "import highspy\n",
        "from collections.abc import Mapping\nfrom typing import TYPE_CHECKING\n",
        "from . import fit\nfrom .framework.cycle import Cycle\n",
        "import uuid\nuuid.uuid5(uuid.NAMESPACE_URL, 'x')\n",
    ],
)
def test_the_walk_passes_pure_imports(source: str) -> None:
    assert violations(source, "kallot.core.example") == []
