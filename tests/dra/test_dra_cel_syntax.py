"""CEL's optional syntax and namespaced functions, rewritten for the ``cel`` crate
(``config.dra_cel_syntax``); upstream's answers for the same forms are in
tests/dra/test_dra_cel_upstream.py."""

from __future__ import annotations

import pytest

from kallot.config.dra import slice_from_json
from kallot.config.dra_cel import compile_selector
from kallot.config.dra_cel_syntax import rewrite_bind, rewrite_namespaced, rewrite_optional
from kallot.core.dra.model import Device, Placement
from kallot.core.errors import ConfigError

A = "device.attributes['d.io']"
DEV = slice_from_json(
    {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "d.io",
            "pool": {"name": "p"},
            "nodeName": "n",
            "devices": [{"name": "x", "attributes": {"model": {"string": "h100"}}}],
        },
    }
).devices[0]


@pytest.mark.parametrize(
    ("expression", "want"),
    [
        (f"{A}.?model.orValue('none') == 'h100'", True),
        (f"{A}.?profile.orValue('none') == 'none'", True),
        (f"{A}.?profile.hasValue()", False),
        (f"{A}.?model.value() == 'h100'", True),
        (f"{A}[?'model'].orValue('') == 'h100'", True),
        (f"{A}.?profile.orValue({A}.?model.orValue('x')) == 'h100'", True),  # nested
        (f"{A}.?a.?b.orValue(1) == 1", True),  # a chain: none at the first missing step
        (f"'?' == '?' && {A}.?model.hasValue()", True),  # a '?' inside a string stays
        (f"true ? {A}.?model.orValue('') == 'h100' : false", True),  # after a ternary '?'
    ],
)
def test_optional_forms_evaluate_as_cel(expression: str, want: bool) -> None:
    assert compile_selector(expression, "e").matches(DEV) is want


def test_an_optional_used_otherwise_stays_and_is_refused() -> None:
    text = f"{A}.?model.or(optional.of('x')).value() == 'h100'"
    assert rewrite_optional(text) == text
    with pytest.raises(ConfigError, match="no function 'or'"):
        compile_selector(text, "spec.selectors[0].cel.expression")


def test_namespaced_functions_are_renamed_not_members() -> None:
    assert rewrite_namespaced("sets.contains([1], [1])") == "sets_contains([1], [1])"
    assert rewrite_namespaced("x.sets.contains([1])") == "x.sets.contains([1])"


@pytest.mark.parametrize("text", ["url('https://x').getHost() == 'x'", "[1].all(i, v, v > i)"])
def test_functions_outside_the_environment_are_refused_at_compile_time(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        compile_selector(text, "spec.selectors[0].cel.expression")
    assert "\n" not in str(err.value) and "spec.selectors[0].cel.expression" in str(err.value)


def test_cel_bind_is_its_body_with_the_value_in_place() -> None:
    assert rewrite_bind("cel.bind(a, 2, x.a == a)") == "(x.a==(2))"  # a field is not the name
    assert rewrite_bind("cel.bind(a, 1, cel.bind(b, a + 1, a + b == 3))") == "(((1)+((1)+1)==3))"
    assert rewrite_bind("cel.bind(a, 1, cel.bind(a, 2, a))") == "(((2)))"  # inner shadows
    rebinding = "cel.bind(a, [1], a.exists(a, a == 1))"
    assert rewrite_bind(rebinding) == rebinding  # left alone: refused as an unknown function
    dev = Device("d.io", "p", "x", Placement(node_name="n"), attributes={"d.io/t": "gpu"})
    sel = compile_selector("cel.bind(v, device.attributes['d.io'], v.t == 'gpu')", "f")
    assert sel.matches(dev) is True
    with pytest.raises(ConfigError, match="no function 'bind'"):
        compile_selector(rebinding, "f")
