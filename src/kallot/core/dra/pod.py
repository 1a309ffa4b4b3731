"""A pod's ResourceClaims as the session sees them.

Where it sits: between the kube shell and the ``DraAllocation`` plugin
(``core.plugins.dra_fit``). The shell reads ``spec.resourceClaims`` into ``PodClaimRef`` s
(``PodInfo.resource_claims``); before each session it resolves them against its DRA cache into
``PodClaims`` (``PodInfo.dra``): the claims as they are now (allocated or not), and the
cluster's DRA ``Inventory`` shared by every task of the session. ``error`` is why the claims
cannot be allocated anywhere (a claim not created yet, a selector that does not compile), one
line naming the claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kallot.core.dra.allocator import Inventory
from kallot.core.dra.extended import ExtendedClaim
from kallot.core.dra.model import ResourceClaim


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One entry of ``spec.resourceClaims``: the ResourceClaim it names, or the template the
    resourceclaim controller creates it from (its name is then in
    ``status.resourceClaimStatuses``; "" until it is created)."""

    name: str
    claim: str = ""
    template: str = ""


@dataclass(frozen=True, slots=True)
class PodClaims:
    claims: tuple[ResourceClaim, ...]
    inventory: Inventory
    error: str = ""
    # (claims' signature, node state) -> (fits, policy key), kept by the shell across sessions
    # (core.plugins.dra_fit); None: per session only.
    memo: dict[Any, Any] | None = field(default=None, compare=False, repr=False)
    # Extended resources served by DRA (core.dra.extended): the pod's special claim (also in
    # ``claims``), and the nodes where it does not apply because they advertise one of its
    # resources (a device plugin serves it there).
    extended: ExtendedClaim | None = None
    off_nodes: frozenset[str] = frozenset()

    def say(self, reason: str) -> str:
        """``reason`` naming the special claim by its resources and classes."""
        if self.extended is None:
            return reason
        key = self.extended.claim.key
        what = f"extended resource {self.extended.describe()}"
        reason = reason.replace(f"claims {key}:", f"{what}:").replace(f"claim {key}", what)
        return reason.replace(key, f"the claim for {what}")
