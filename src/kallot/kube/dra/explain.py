"""``kallot explain`` for pods with ResourceClaims: each claim of the pod, its requests, and
what it is allocated to (or that it is not yet), from the API objects.

Where it sits: called by ``kube.ops.explain`` (``describe`` takes the claims, ``fetch`` reads
them). Why a pod with claims is pending is in its ``PodScheduled`` condition and Events, as
for any pod: the DraAllocation plugin's reasons name the claim, the request and the
expression ("claim ns/c, request gpu: wants 1, 3 devices match, 3 in use or out of
counters"). Extended resources served by DRA (``nvidia.com/gpu`` from a DeviceClass with
``extendedResourceName``) show their special claim, named in the pod's
``status.extendedResourceClaimStatus``, and which container's resource each request serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kallot.core.errors import ConfigError
from kallot.kube.api import k8s_fields


def _special(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims the pod uses (generated ones once the controller created them, the
    special claim for extended resources once a scheduler created it)."""
    special = str(_special(pod).get("resourceClaimName") or "")
    try:
        names = [r.claim for r in k8s_fields.resource_claims(pod) if r.claim]
    except ConfigError:
        names = []
    return [*names, special] if special else names


def _claim_text(obj: Mapping[str, Any]) -> str:
    """``[request: count of class; ...]: allocated ...; reserved for ...`` of one claim."""
    requests = []
    for r in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        ex = r.get("exactly")
        if ex:
            count = ex.get("count", 1) if ex.get("allocationMode", "ExactCount") != "All" else "all"
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
    return f"[{'; '.join(requests)}]: {state}"


def _extended_lines(pod: Mapping[str, Any], by_name: Mapping[str, Mapping[str, Any]]) -> list[str]:
    special = _special(pod)
    name = str(special.get("resourceClaimName") or "")
    if not name:
        return []
    serves = ", ".join(
        f"{m.get('containerName')}/{m.get('resourceName')}={m.get('requestName')}"
        for m in special.get("requestMappings") or []
    )
    obj = by_name.get(name)
    state = _claim_text(obj) if obj is not None else "not found"
    return [
        f"Extended resources by DRA ({serves}):",
        f"  claim {name} {state}",
    ]


def claim_lines(pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]) -> list[str]:
    try:
        refs = k8s_fields.resource_claims(pod)
    except ConfigError as exc:
        return [f"ResourceClaims: invalid: {exc}"]
    by_name = {str((c.get("metadata") or {}).get("name", "")): c for c in claims}
    extended = _extended_lines(pod, by_name)
    if not refs:
        return extended
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
        out.append(f"  {ref.name}: claim {ref.claim} {_claim_text(obj)}")
    return [*out, *extended]
