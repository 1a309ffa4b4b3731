"""kallot's quantity parser (kube.translate.quantity) against the official client's
``kubernetes.utils.parse_quantity`` as an oracle: the same value on every quantity kallot
accepts, and a refusal (naming the field) of what the API server refuses but the client lets
through."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from kallot.core.errors import ConfigError
from kallot.kube.translate import quantity

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


@st.composite
def quantities(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.integers(min_value=0, max_value=10**9))
    number = str(whole)
    shape = draw(st.sampled_from(["int", "frac", "dot", "lead"]))
    digits = str(draw(st.integers(min_value=0, max_value=10**6)))
    if shape == "frac":
        number = f"{whole}.{digits}"
    elif shape == "dot":
        number = f"{whole}."
    elif shape == "lead":
        number = f".{digits}"
    if draw(st.booleans()):
        e = draw(st.sampled_from(["e", "E"]))
        esign = draw(st.sampled_from(["", "+", "-"]))
        return f"{sign}{number}{e}{esign}{draw(st.integers(min_value=0, max_value=12))}"
    return f"{sign}{number}{draw(st.sampled_from(SUFFIXES))}"


@given(quantities())
def test_same_value_as_the_official_client(text: str) -> None:
    assert quantity.parse_quantity(text, "f") == client_parse_quantity(text)  # type: ignore[no-untyped-call]  # kubernetes.utils.quantity is untyped


@pytest.mark.parametrize(
    ("text", "client_value"),
    [
        pytest.param("1K", Decimal(1000), id="upper-case K is not a Kubernetes suffix"),
        pytest.param("NaN", None, id="not a number"),
        pytest.param("Infinity", Decimal("Infinity"), id="infinite"),
    ],
)
def test_refuses_what_the_client_lets_through(text: str, client_value: Decimal | None) -> None:
    got = client_parse_quantity(text)  # type: ignore[no-untyped-call]  # kubernetes.utils.quantity is untyped
    assert got.is_nan() if client_value is None else got == client_value
    with pytest.raises(ConfigError, match=r"spec\.x"):
        quantity.parse_quantity(text, "spec.x")
