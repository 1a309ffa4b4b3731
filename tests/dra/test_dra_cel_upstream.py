"""kallot's CEL selectors against upstream's environment, one function at a time.

Every entry of kallot.testing.dra_cel_cases (a function of kube-scheduler's DRA selector
environment at 1.36) is compiled and evaluated by kallot (``config.dra_cel``) and by upstream
(``k8s.io/dynamic-resource-allocation/cel`` v0.36.3 through tools/testenv/dra-diff) on the same
device. Either they agree (both true, both false, both a compile error, or both a runtime
error), or the function is one kallot does not implement (``UNSUPPORTED``, listed in docs/dra.md
"CEL functions"): kallot then refuses the selector when it compiles it, with a one-line error,
so a claim using it fails visibly instead of being allocated by other rules.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from kallot.config.dra import slice_from_json
from kallot.config.dra_cel import compile_selector
from kallot.core.dra.model import SelectorError
from kallot.core.errors import ConfigError
from kallot.testing.dra_cel_cases import DEVICE, FUNCTIONS
from kallot.testing.dra_diff import Upstream

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs Go to build dra-diff")

# Functions of upstream's environment kallot does not implement (none at 1.36; docs/dra.md
# "CEL functions" lists the forms it refuses).
UNSUPPORTED: frozenset[str] = frozenset()
# Refused by upstream's type checker when the selector is compiled, by kallot (which has no
# checker) when it runs: either way the claim is not allocated (docs/dra.md "CEL functions").
REFUSED_LATER = frozenset({"reverse (string: ext.Strings v3, not here)"})


def _device() -> Any:
    body = {
        "metadata": {"name": "s"},
        "spec": {
            "driver": DEVICE["driver"],
            "pool": {"name": "p"},
            "nodeName": "n",
            "devices": [
                {
                    "name": "d",
                    "attributes": DEVICE["attributes"],
                    "capacity": DEVICE["capacity"],
                    "allowMultipleAllocations": DEVICE["allowMultipleAllocations"],
                }
            ],
        },
    }
    return slice_from_json(body).devices[0]


def kallot(expression: str) -> str:
    try:
        sel = compile_selector(expression, "expr")
    except ConfigError:
        return "compile_error"
    try:
        return "true" if sel.matches(_device()) else "false"
    except SelectorError:
        return "runtime_error"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


def upstream_answer(up: Upstream, expression: str) -> str:
    got = up.ask(
        {
            "id": expression,
            "cel": expression,
            "listTypes": "includes" in expression,
            "device": DEVICE,
        }
    )
    if got["status"] == "ok":
        return "true" if got["value"] else "false"
    return str(got["status"])


@pytest.mark.parametrize(
    ("library", "function", "expression"), FUNCTIONS, ids=[f[1] for f in FUNCTIONS]
)
def test_function_agrees_with_upstream(
    upstream: Upstream, library: str, function: str, expression: str
) -> None:
    theirs = upstream_answer(upstream, expression)
    mine = kallot(expression)
    if function in UNSUPPORTED:
        assert theirs == "true", f"upstream answers {theirs}: the case itself is wrong"
        assert mine == "compile_error", f"{function}: kallot answers {mine}, expected a refusal"
        return
    if function in REFUSED_LATER:
        assert (theirs, mine) == ("compile_error", "runtime_error"), function
        return
    assert mine == theirs, f"{library} {function}: kallot {mine}, upstream {theirs}"


def test_every_upstream_case_is_meaningful(upstream: Upstream) -> None:
    """Each case is true upstream (it tests the function, not a typo), except the ones about
    errors and what the environment lacks."""
    for _, function, expression in FUNCTIONS:
        want = "true"
        if "error" in function:
            want = "runtime_error"
        elif function in REFUSED_LATER or function in {
            "math.greatest",
            "sign (on a quantity)",
            "matches (bad constant pattern)",
        }:
            want = "compile_error"
        assert upstream_answer(upstream, expression) == want, function
