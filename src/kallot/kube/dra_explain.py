"""``kallot explain`` for pods with ResourceClaims: each claim of the pod, its requests, and
what it is allocated to (or that it is not yet), from the API objects.

Where it sits: called by ``kube.explain`` (``describe`` takes the claims, ``fetch`` reads
them). Why a pod with claims is pending is in its ``PodScheduled`` condition and Events, as
for any pod: the DraAllocation plugin's reasons name the claim, the request and the
expression ("claim ns/c, request gpu: wants 1, 3 devices match, 3 in use or out of
counters").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kallot.core.errors import ConfigError
from kallot.kube import k8s_fields


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims the pod uses (generated ones once the controller created them)."""
    try:
        return [r.claim for r in k8s_fields.resource_claims(pod) if r.claim]
    except ConfigError:
        return []


def claim_lines(pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]) -> list[str]:
    try:
        refs = k8s_fields.resource_claims(pod)
    except ConfigError as exc:
        return [f"ResourceClaims: invalid: {exc}"]
    if not refs:
        return []
    by_name = {str((c.get("metadata") or {}).get("name", "")): c for c in claims}
    out = ["ResourceClaims:"]
    for ref in refs:
        if not ref.claim:
            out.append(
                f"  {ref.name}: from template {ref.template}, not created yet "
                "(kube-controller-manager creates it)"
            )
            continue
        obj = by_name.get(ref.claim)
        if obj is None:
            out.append(f"  {ref.name}: ResourceClaim {ref.claim} not found")
            continue
        requests = []
        for r in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
            ex = r.get("exactly")
            if ex:
                count = (
                    ex.get("count", 1) if ex.get("allocationMode", "ExactCount") != "All" else "all"
                )
                requests.append(f"{r.get('name')}: {count} of {ex.get('deviceClassName')}")
            else:
                subs = [s.get("deviceClassName") for s in r.get("firstAvailable") or []]
                requests.append(f"{r.get('name')}: first available of {', '.join(map(str, subs))}")
        status = obj.get("status") or {}
        alloc = status.get("allocation")
        if alloc:
            got = ", ".join(
                f"{d.get('request')}={d.get('pool')}/{d.get('device')}"
                + (f" ({d['consumedCapacity']})" if d.get("consumedCapacity") else "")
                for d in (alloc.get("devices") or {}).get("results") or []
            )
            users = ", ".join(str(u.get("name")) for u in status.get("reservedFor") or [])
            state = f"allocated {got}; reserved for {users or 'nobody'}"
        else:
            state = "not allocated"
        out.append(f"  {ref.name}: claim {ref.claim} [{'; '.join(requests)}]: {state}")
    return out
