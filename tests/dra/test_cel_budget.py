"""Cost limits of DRA CEL selectors (``config.dra_cel``): the length and the estimated
worst-case cost are checked at compile time (one-line ``ConfigError`` naming the field), one
evaluation over its wall-clock budget fails that claim only (``SelectorError``), and the
compiled-selector cache and each selector's per-device memo are bounded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from fractions import Fraction

import pytest

from kallot.config import dra_cel
from kallot.config.dra import claim_from_json
from kallot.config.dra_cel import compile_selector, estimate_cost
from kallot.core.dra.allocator import candidates_for
from kallot.core.dra.model import Capacity, Device, DeviceClass, Placement, SelectorError
from kallot.core.errors import ConfigError
from kallot.testing.dra import claim, exactly

FIELD = "claim default/c, request gpu: selectors[0].cel.expression"


@pytest.fixture(autouse=True)
def _keep_cache() -> Iterator[None]:
    saved = OrderedDict(dra_cel._COMPILED)
    yield
    dra_cel._COMPILED.clear()
    dra_cel._COMPILED.update(saved)


def dev(name: str = "x", **attrs: int | bool | str) -> Device:
    return Device(
        "d.io",
        "p",
        name,
        Placement(node_name="n"),
        {f"d.io/{k}": v for k, v in attrs.items()},
        {"d.io/memory": Capacity(Fraction(40 * 2**30))},
    )


def literal(n: int) -> str:
    return "[" + ",".join(str(i) for i in range(n)) + "]"


def test_over_long_expression_is_refused_in_one_line_naming_the_field() -> None:
    assert dra_cel.MAX_EXPRESSION_CHARS == 10_240  # Kubernetes' CELSelectorExpressionMaxLength
    assert dra_cel.MAX_COST == 1_000_000  # Kubernetes' CELSelectorExpressionMaxCost
    long = "device.driver == '" + "x" * 10_300 + "'"
    with pytest.raises(ConfigError) as err:
        claim_from_json(claim("c", [exactly("gpu", "gpu.kallot.io", selectors=[long])]))
    text = str(err.value)
    assert "\n" not in text
    assert "selectors[0].cel.expression" in err.value.field
    assert "at most 10240 characters (got 10319)" in text
    assert len(text) < 600  # the value is cut
    # The longest allowed expression compiles and evaluates.
    pad = dra_cel.MAX_EXPRESSION_CHARS - len("device.driver == ''")
    expr = "device.driver == '" + "y" * pad + "'"
    assert len(expr) == dra_cel.MAX_EXPRESSION_CHARS
    assert compile_selector(expr, FIELD).matches(dev()) is False


def test_deeply_nested_comprehensions_are_refused_at_compile_time() -> None:
    n = literal(100)
    # 100**3 = 1e6 evaluations of the body: the old code compiled it and the allocator ran it.
    expr = f"{n}.all(a, {n}.all(b, {n}.all(c, a + b + c >= 0)))"
    with pytest.raises(ConfigError, match=r"nested at most 2 deep \(got 3\)") as err:
        compile_selector(expr, FIELD)
    assert err.value.field == FIELD
    assert "\n" not in str(err.value)


def test_expensive_comprehension_is_refused_by_its_estimated_cost() -> None:
    n = "[" + ",".join(["1"] * 1500) + "]"  # 1500 x 1500 evaluations of the body, two deep
    expr = f"{n}.exists(a, {n}.exists(b, a * b == -1))"
    with pytest.raises(ConfigError, match=r"estimated worst-case cost of at most 1,000,000"):
        compile_selector(expr, FIELD)
    # A range of unknown size (an attribute map) counts as UNKNOWN_RANGE_SIZE elements.
    body = " && ".join(["k != ''"] * 40)
    unknown = f"device.attributes['d.io'].all(k, device.attributes['d.io'].all(j, {body}))"
    with pytest.raises(ConfigError, match="too complex"):
        compile_selector(unknown, FIELD)


def test_ordinary_selectors_still_work_and_strings_hide_no_macro() -> None:
    fine = f"{literal(10)}.exists(i, i == device.attributes['d.io'].n)"
    assert compile_selector(fine, FIELD).matches(dev(n=3)) is True
    assert compile_selector(fine, FIELD).matches(dev("y", n=30)) is False
    # Macros inside string literals are text, not comprehensions.
    text = "'[1].all(x, [1].all(y, [1].all(z, true)))' != device.driver"
    assert estimate_cost(text)[2] == 0
    assert compile_selector(text, FIELD).matches(dev()) is True
    # A raw string ends at its quote (no escapes): the macro after it counts.
    raw = r"r'\' + [1].all(x, [1].all(y, [1].all(z, true))) ? '' : ''"
    assert estimate_cost(raw)[2] == 3


def test_slow_evaluation_fails_that_claim_only() -> None:
    ticks = iter(float(i) for i in range(100))
    sel = compile_selector("device.attributes['d.io'].n > 1", FIELD)
    rc = claim_from_json(
        claim("c", [exactly("gpu", "d", selectors=["device.attributes['d.io'].n > 1"])])
    )
    req = rc.requests[0].exactly
    assert req is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dra_cel, "_clock", lambda: next(ticks))  # every evaluation takes 1 s
        with pytest.raises(SelectorError, match=r"over the budget of 0\.1 s"):
            sel.matches(dev(n=3))
        with pytest.raises(ValueError, match=r"claim default/c, request gpu: .*over the budget"):
            candidates_for(rc, "gpu", req, [dev(n=3)], {"d": DeviceClass("d")})
    assert sel.matches(dev(n=3)) is True  # the clock back: the same selector evaluates


def test_compiled_cache_never_grows_past_its_bound_and_is_lru() -> None:
    bound = dra_cel.MAX_COMPILED
    assert bound == 4_096
    dra_cel._COMPILED.clear()
    first = compile_selector("device.driver == 'first'", FIELD)
    for i in range(bound - 1):
        compile_selector(f"device.driver == 'd{i}'", FIELD)
    assert len(dra_cel._COMPILED) == bound
    assert compile_selector("device.driver == 'first'", FIELD) is first  # used: most recent
    compile_selector("device.driver == 'one more'", FIELD)
    assert len(dra_cel._COMPILED) == bound
    assert "device.driver == 'd0'" not in dra_cel._COMPILED  # the least recently used went
    assert "device.driver == 'first'" in dra_cel._COMPILED
    for i in range(bound + 50):
        compile_selector(f"device.driver == 'e{i}'", FIELD)
        assert len(dra_cel._COMPILED) <= bound
    assert len(dra_cel._COMPILED) == bound
    assert "device.driver == 'first'" not in dra_cel._COMPILED
    assert f"device.driver == 'e{bound + 49}'" in dra_cel._COMPILED


def test_per_device_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dra_cel, "MAX_MEMO_DEVICES", 3)
    sel = compile_selector("device.attributes['d.io'].n > 1", FIELD)
    for i in range(10):
        assert sel.matches(dev(f"g{i}", n=i)) is (i > 1)
        assert len(sel._by_content) <= 3  # by what it reads: n
    whole = compile_selector("'d.io' in device.attributes", FIELD)  # no list of fields
    for i in range(10):
        assert whole.matches(dev(f"g{i}", n=i)) is True
        assert len(whole._cache) <= 3


def test_a_range_bound_to_a_variable_counts_as_the_largest_list() -> None:
    n = "[" + ",".join(["1"] * 1200) + "]"
    # One element outside, 2400 inside (a + a): the inner range is no literal. Counted as
    # UNKNOWN_RANGE_SIZE (128) it would pass; it costs about 2400 x 600 tokens.
    body = " && ".join(["x == 1"] * 150)
    expr = f"[{n}].all(a, (a + a).all(x, {body}))"
    assert compile_selector(expr.replace("(a + a)", "[1, 2]"), FIELD) is not None
    with pytest.raises(ConfigError, match="too complex"):
        compile_selector(expr, FIELD)


def test_library_calls_are_charged_upstreams_runtime_cost() -> None:
    """k8s.io/apiserver/pkg/cel/library/cost.go and cel-go's ext.Lists trackers, per call."""
    from kallot.config.dra_cel_cost import LIMIT, call_cost

    assert LIMIT == dra_cel.MAX_COST
    assert call_cost("lowerAscii", ("x" * 95,), "") == 10  # ceil(95 x 0.1)
    assert call_cost("split", ("x" * 10,), []) == 2  # traversal and result: 2 x 0.1
    assert call_cost("find", ("x" * 9, "[0-9]+"), "") == 1 * 2  # ceil(1.0) x ceil(1.5)
    assert call_cost("lists_range", (5,), [0, 1, 2, 3, 4]) == 5  # the output's size
    assert call_cost("sort", (list(range(8)),), []) == 8 * 3  # n log2 n
    assert call_cost("validate", ("\x00format:uri", "x" * 19), None) == 2 * 276
    assert call_cost("family", ("\x00ip:::1",), 6) == 1  # accessors are nominal


def test_evaluation_over_the_runtime_cost_limit_fails_that_claim_only() -> None:
    sel = compile_selector("lists.range(2000000).size() > 0", FIELD)
    with pytest.raises(SelectorError, match="actual cost limit exceeded"):
        sel.matches(dev())
    # Each evaluation starts from zero: many cheap calls on many devices never add up.
    cheap = compile_selector("lists.range(300000).size() > 0 || true", FIELD)
    assert all(cheap.crate(dev(f"c{i}")) for i in range(4))  # 4 x 300,000 in all


def test_two_variable_comprehensions_count_in_the_estimate() -> None:
    n = "[" + ",".join(["1"] * 1500) + "]"
    with pytest.raises(ConfigError, match="too complex"):
        compile_selector(f"{n}.exists(i, a, {n}.exists(j, b, a * b == -1))", FIELD)
    with pytest.raises(ConfigError, match=r"nested at most 2 deep \(got 3\)"):
        compile_selector(
            "[1].all(i, a, [1].all(j, b, [1].transformList(k, c, c).size() > 0))", FIELD
        )
