"""CEL's optional syntax and namespaced functions, rewritten for the ``cel`` crate
(``config.dra_cel_syntax``); upstream's answers for the same forms are in
tests/dra/test_dra_cel_upstream.py."""

from __future__ import annotations

import pytest

from kallot.config.dra import slice_from_json
from kallot.config.dra_cel import compile_selector
from kallot.config.dra_cel_syntax import (
    rewrite_bind,
    rewrite_namespaced,
    rewrite_optional,
    rewrite_optional_entries,
    rewrite_receiver_macros,
    rewrite_two_var,
    wrap_string_calls,
)
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


def test_an_optional_used_otherwise_is_a_real_optional_value() -> None:
    text = f"{A}.?model.or(optional.of('x')).value() == 'h100'"
    assert (
        rewrite_optional(text) == f"_opt_select({A}, 'model').or(optional.of('x')).value()=='h100'"
    )
    assert compile_selector(text, "e").matches(DEV) is True
    assert compile_selector(f"{A}.?nope.?deeper == optional.none()", "e").matches(DEV) is True
    assert compile_selector(f"{A}[?'model'] == optional.of('h100')", "e").matches(DEV) is True


def test_optional_entries_of_literals_keep_only_set_values() -> None:
    assert rewrite_optional_entries("[1, ?o]") == "optional_unwrap([optional.of(1), o])"
    assert rewrite_optional_entries("{'a': 1, ?'b': o}") == (
        "_opt_map([['a', optional.of(1)], ['b', o]])"
    )
    assert rewrite_optional_entries("x[?0]") == "x[?0]"  # an index: rewrite_optional's
    sel = compile_selector(f"[?{A}.?model, ?{A}.?nope] == ['h100']", "e")
    assert sel.matches(DEV) is True


def test_two_variable_comprehensions_iterate_keys_and_read_values_back() -> None:
    out = rewrite_two_var("[1, 2].all(i, v, v > i)")
    assert out.startswith("(_keys([1,2]).all(_kv") and "([1,2])[_kv" in out
    # A macro inside that binds the same name again: left alone, then refused.
    rebinding = "[1].all(i, v, [2].exists(v, v == i))"
    assert rewrite_two_var(rebinding) == rebinding
    with pytest.raises(ConfigError, match="two-variable all"):
        compile_selector(rebinding, "f")
    # An outer variable of the same name as the index is not captured (fresh names).
    sel = compile_selector("[0, 1].exists(i, [5].exists(i, v, v == 5 && i == 0))", "f")
    assert sel.matches(DEV) is True


def test_sort_by_opt_map_and_string_of_an_ip_are_rewritten() -> None:
    assert (
        rewrite_receiver_macros("[2, 1].sortBy(x, -x)") == "(_sort_by([2,1], ([2,1]).map(x, -x)))"
    )
    assert rewrite_receiver_macros("o.optMap(x, x + 1)") == (
        "(((o).hasValue() ? optional.of((o).value()+1) : optional.none()))"
    )
    assert wrap_string_calls("string(ip('::1')) == '::1'") == "_untag(string(ip('::1')))=='::1'"
    assert wrap_string_calls("type(x) == string") == "type(x)==string"


def test_namespaced_functions_are_renamed_not_members() -> None:
    assert rewrite_namespaced("sets.contains([1], [1])") == "sets_contains([1], [1])"
    assert rewrite_namespaced("x.sets.contains([1])") == "x.sets.contains([1])"


@pytest.mark.parametrize("text", ["math.greatest(1, 2) == 2", "quantity('1').sign() == 1"])
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
