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
