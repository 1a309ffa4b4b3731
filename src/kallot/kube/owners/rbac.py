"""The chart's RBAC for the owner kinds, written from the table (``kinds.KINDS``).

Where it sits: beside the table, read by tools/gen_owner_rbac.py (which writes the block between
``BEGIN`` and ``END`` in charts/kallot/templates/rbac.yaml) and by
tests/kube/test_owners_table.py (which checks that block, the rendered deploy/kallot.yaml and
``kallot doctor``'s list against the table): a new kind's RBAC is its entry, not a hand edit.
"""

from __future__ import annotations

from kallot.kube.owners.kinds import KINDS

CHART_FILE = "charts/kallot/templates/rbac.yaml"
BEGIN = "  # BEGIN owner kinds: generated from kallot.kube.owners.KINDS by tools/gen_owner_rbac.py"
END = "  # END owner kinds"


def render() -> str:
    """The block (markers included): a read-only rule per owner kind with objects to read,
    under a comment saying what kallot reads it for."""
    lines = [BEGIN, "  # (the CRD-based kinds are read only where their CRDs are served)"]
    for k in KINDS:
        rule = k.rbac
        if rule is None:
            continue
        group, resource, verbs = rule
        lines += [
            f"  # {k.why}",
            f"  - apiGroups: [{group or chr(34) * 2}]",
            f"    resources: [{resource}]",
            f"    verbs: [{', '.join(verbs)}]",
        ]
    return "\n".join([*lines, END]) + "\n"


def replace_block(text: str) -> str:
    """``text`` (the chart's rbac.yaml) with its block written from the table."""
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END) + 1
    return text[:start] + render() + text[end:]


def block(text: str) -> str:
    """The block as ``text`` has it (markers included)."""
    start = text.index(BEGIN)
    return text[start : text.index(END, start) + len(END) + 1]
