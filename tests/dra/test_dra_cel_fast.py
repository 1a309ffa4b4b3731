"""The CEL fast path (config.dra_cel_fast) answers exactly what the ``cel`` crate answers.

Every selector of the differential suite's generator and of the per-function table, on every
device of 60 generated cases, and hypothesis-built expressions of the fast path's subset on
random devices: wherever the fast path answers a bool, the crate (the authoritative
evaluation, itself checked against upstream by tests/dra/test_dra_cel_upstream.py and the
differential suite) answers the same bool; where it is unsure, ``matches`` gives the crate's
answer or error.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config.dra import slice_from_json
from kallot.config.dra_cel import CelSelector, compile_selector
from kallot.config.dra_cel_fast import ALLOW, ATTRIBUTE, CAPACITY, DRIVER, Unsure, content, reads
from kallot.config.dra_cel_syntax import rewrite
from kallot.core.dra.model import Capacity, Device, Placement, SelectorError, Version
from kallot.testing.dra_cases import FAILING, LIST_SELECTORS, SELECTORS, case
from kallot.testing.dra_cel_cases import FUNCTIONS

FIELD = "claim default/c, request gpu: selectors[0].cel.expression"


def _answers(sel: CelSelector, dev: Device) -> tuple[bool | None, bool | str]:
    try:
        fast: bool | None = sel._fast(dev) if sel._fast is not None else None
    except Unsure:
        fast = None
    try:
        crate: bool | str = sel.crate(dev)
    except SelectorError:
        crate = "error"
    return fast, crate


def _suite_devices() -> list[Device]:
    out: list[Device] = []
    for seed in range(60):
        for s in case(seed)["slices"]:
            out.extend(slice_from_json(s).devices)
    return out


def _compiles(expression: str) -> bool:
    try:
        compile_selector(expression, FIELD)
    except Exception:
        return False
    return True


def test_fast_path_agrees_with_the_crate_on_the_suites_selectors_and_devices() -> None:
    exprs = [*SELECTORS, *FAILING, *LIST_SELECTORS, *(e for _, _, e in FUNCTIONS if _compiles(e))]
    devices = _suite_devices()
    sure = 0
    for expression in exprs:
        sel = compile_selector(expression, FIELD)
        for dev in devices:
            fast, crate = _answers(sel, dev)
            if fast is not None:
                sure += 1
                assert fast == crate, f"{expression} on {dev.id}: fast {fast}, crate {crate}"
    # The generator's selectors are all in the subset, and it answers most evaluations.
    assert all(compile_selector(e, FIELD).fast for e in (*SELECTORS, *FAILING, *LIST_SELECTORS))
    assert sure > len(devices) * len(SELECTORS) // 2


def test_unsure_evaluations_give_the_crates_error_in_matches() -> None:
    sel = compile_selector("device.attributes['gpu.nvidia.com'].profile == '1g.5gb'", FIELD)
    assert sel.fast
    whole = Device("gpu.nvidia.com", "p", "gpu-0", Placement(node_name="n"))
    with pytest.raises(SelectorError, match="profile"):
        sel.matches(whole)


D = "d.io"
ATTRS = st.dictionaries(
    st.sampled_from([f"{D}/a", f"{D}/b", f"{D}/s", f"{D}/v", "x.io/a"]),
    st.one_of(
        st.integers(-3, 3),
        st.booleans(),
        st.sampled_from(["", "ab", "abc", "b"]),
        st.sampled_from([Version(1, 2, 3), Version(2, 0, 0)]),
        st.tuples(st.integers(0, 2), st.integers(0, 2)),
    ),
    max_size=5,
)
CAPS = st.dictionaries(
    st.sampled_from([f"{D}/m", f"{D}/n"]),
    st.sampled_from([Fraction(0), Fraction(5), Fraction(1, 2)]),
    max_size=2,
)
LEAF = st.sampled_from(
    [
        f"device.attributes['{D}'].a",
        f"device.attributes['{D}']['b']",
        f"device.attributes['{D}'].s",
        f"device.attributes['{D}'].v",
        "device.attributes['x.io'].a",
        "device.driver",
        "device.allowMultipleAllocations",
        "1",
        "-2",
        "'ab'",
        "true",
        "semver('1.2.3')",
        f"device.capacity['{D}'].m",
        "quantity('5')",
    ]
)


def _bools(leaf: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    atom = st.one_of(
        st.builds(
            lambda a, op, b: f"{a} {op} {b}", leaf, st.sampled_from(["==", "!=", "<", ">="]), leaf
        ),
        st.builds(lambda a: f"{a} in [1, 'ab', true]", leaf),
        st.builds(lambda a: f"'{D}' in device.{a}", st.sampled_from(["attributes", "capacity"])),
        st.builds(lambda a: f"has(device.attributes['{D}'].{a})", st.sampled_from("abz")),
        st.builds(lambda a, m: f"{a}.{m}('a')", leaf, st.sampled_from(["startsWith", "contains"])),
        st.builds(lambda a, b: f"{a}.isGreaterThan({b})", leaf, leaf),
        st.builds(lambda a: f"{a}.includes(1)", leaf),
        st.builds(
            lambda m: f"device.attributes['{D}'].{m}(k, k == 'a')",
            st.sampled_from(["exists", "all"]),
        ),
        leaf,
    )
    return st.recursive(
        atom,
        lambda inner: st.one_of(
            st.builds(lambda a, b: f"({a} && {b})", inner, inner),
            st.builds(lambda a, b: f"({a} || {b})", inner, inner),
            st.builds(lambda a: f"!({a})", inner),
            st.builds(lambda a, b, c: f"({a} ? {b} : {c})", inner, inner, inner),
        ),
        max_leaves=6,
    )


@settings(max_examples=300, deadline=None)
@given(expression=_bools(LEAF), attrs=ATTRS, caps=CAPS, shared=st.booleans())
def test_fast_path_agrees_with_the_crate_on_generated_expressions(
    expression: str, attrs: dict[str, object], caps: dict[str, Fraction], shared: bool
) -> None:
    try:
        sel = compile_selector(expression, FIELD)
    except Exception:
        return  # the crate refuses it: never evaluated
    dev = Device(
        "d.io",
        "p",
        "x",
        Placement(node_name="n"),
        attributes=attrs,  # type: ignore[arg-type]
        capacity={k: Capacity(v) for k, v in caps.items()},
        allow_multiple=shared,
    )
    fast, crate = _answers(sel, dev)
    if fast is not None:
        assert fast == crate, f"{expression}: fast {fast}, crate {crate}"


def _crate_answer(sel: CelSelector, dev: Device) -> bool | str:
    try:
        return sel.crate(dev)
    except SelectorError as exc:
        return str(exc)


def _matches_answer(sel: CelSelector, dev: Device) -> bool | str:
    try:
        return sel.matches(dev)
    except SelectorError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(
    expression=_bools(LEAF),
    first=st.tuples(ATTRS, CAPS, st.booleans()),
    second=st.tuples(ATTRS, CAPS, st.booleans()),
    driver=st.sampled_from(["d.io", "x.io"]),
)
def test_devices_alike_in_the_fields_a_selector_reads_get_the_crates_same_answer(
    expression: str,
    first: tuple[dict[str, object], dict[str, Fraction], bool],
    second: tuple[dict[str, object], dict[str, Fraction], bool],
    driver: str,
) -> None:
    """The content memo's premise (``dra_cel_fast.reads``): a second device that agrees with
    the first on every field the expression reads, whatever else it has, gets the crate's same
    answer or error; and ``matches`` (through the memo, in either order) gives each device the
    crate's own answer."""
    try:
        sel = compile_selector(expression, FIELD)
    except Exception:
        return
    paths = reads(rewrite(expression))
    if paths is None:
        return  # no memo by content for it: nothing to check
    a = _device("a", *first, driver="d.io")
    attrs, caps = dict(second[0]), {k: Capacity(v) for k, v in second[1].items()}
    shared = second[2]
    for kind, name in paths:  # copy what the expression reads, present or missing
        if kind == ATTRIBUTE:
            attrs.pop(name, None)
            if name in a.attributes:
                attrs[name] = a.attributes[name]
        elif kind == CAPACITY:
            caps.pop(name, None)
            if name in a.capacity:
                caps[name] = a.capacity[name]
        elif kind == ALLOW:
            shared = a.allow_multiple
    b_driver = a.driver if any(kind == DRIVER for kind, _ in paths) else driver
    b = Device(
        b_driver, "p", "b", Placement(node_name="n"), attributes=attrs,  # type: ignore[arg-type]
        capacity=caps, allow_multiple=shared,
    )  # fmt: skip
    assert content(a, paths) == content(b, paths)
    assert _crate_answer(sel, a) == _crate_answer(sel, b), expression
    sel._by_content.clear()
    assert _matches_answer(sel, b) == _crate_answer(sel, b)
    assert _matches_answer(sel, a) == _crate_answer(sel, a)


def _device(
    name: str,
    attrs: dict[str, object],
    caps: dict[str, Fraction],
    shared: bool,
    *,
    driver: str,
) -> Device:
    return Device(
        driver, "p", name, Placement(node_name="n"), attributes=attrs,  # type: ignore[arg-type]
        capacity={k: Capacity(v) for k, v in caps.items()}, allow_multiple=shared,
    )  # fmt: skip


def test_reads_names_literal_paths_only() -> None:
    assert reads(
        "device.driver == 'a' && device.attributes['d.io'].x > 1 && "
        "has(device.capacity['d.io']['m']) && device.allowMultipleAllocations"
    ) == ((DRIVER, ""), (ATTRIBUTE, "d.io/x"), (CAPACITY, "d.io/m"), (ALLOW, ""))
    for whole in (
        "'d.io' in device.attributes",
        "device.attributes['d.io'].exists(k, k == 'a')",
        "['x'].exists(k, device.attributes['d.io'][k] == 1)",
        "device == device",
        "device.attributes['d.io']",
    ):
        assert reads(whole) is None, whole


def test_content_tells_types_apart() -> None:
    paths = ((ATTRIBUTE, "d.io/a"),)
    one = _device("x", {"d.io/a": 1}, {}, False, driver="d.io")
    true = _device("y", {"d.io/a": True}, {}, False, driver="d.io")
    ones = _device("z", {"d.io/a": (1,)}, {}, False, driver="d.io")
    trues = _device("w", {"d.io/a": (True,)}, {}, False, driver="d.io")
    keys = {content(d, paths) for d in (one, true, ones, trues)}
    assert len(keys) == 4
    sel = compile_selector("device.attributes['d.io'].a == 1", FIELD)
    assert sel.matches(one) is True
    assert sel.matches(true) is False  # CEL: a bool never equals an int (1 == True in Python)
    assert sel.matches(ones) is False
