"""The house rule on module size (issue 18): no module in ``src/`` is over 500 lines unless its
docstring has a line starting ``Long module:`` that says why. Generated protobuf code is exempt."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kallot"
LIMIT = 500


def test_long_modules_say_why() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if "proto" in path.parts:
            continue
        text = path.read_text()
        lines = text.count("\n")
        if lines <= LIMIT:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not any(line.startswith("Long module:") for line in doc.splitlines()):
            offenders.append(f"{path.relative_to(SRC.parent)} ({lines} lines)")
    assert not offenders, "over 500 lines without a 'Long module:' line: " + ", ".join(offenders)
