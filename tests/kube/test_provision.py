"""Names kallot's capacity asks carry (kube.autoscale.provision): a gang's id, ``namespace/name``,
becomes a label value the API server accepts (the live test that found it:
tests/kube/test_provision_live.py, whose PodTemplate create was refused with HTTP 422)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from kallot.kube.autoscale.provision import label_value

# Kubernetes' label value rule (apimachinery validation.IsValidLabelValue): at most 63 characters.
VALID = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@given(st.text(max_size=300))
def test_any_text_becomes_a_valid_label_value(text: str) -> None:
    out = label_value(text)
    assert VALID.match(out) and len(out) <= 63, out


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,28}[a-z0-9])?", fullmatch=True).filter(bool))
def test_a_gang_id_keeps_its_namespace_and_name(name: str) -> None:
    assert label_value(f"team-a/{name}") == f"team-a.{name}"
