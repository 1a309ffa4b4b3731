"""The DRA part of a bind, in kube-scheduler's order (its DynamicResources PreBind): for each
of the pod's claims the finalizer ``resource.kubernetes.io/delete-protection``, then
``status.allocation`` and the pod in ``status.reservedFor`` (one status write), and only then
the binder sets ``spec.nodeName``. Every write carries the claim's resourceVersion: a
conflict re-reads the claim and tries again; a claim allocated by someone else meanwhile fails
the bind (the pod is decided again). A bind that fails gives back what it wrote (``undo``):
the pod leaves ``reservedFor`` and an allocation it wrote that nobody else reserves is
cleared, so no claim stays allocated for a pod that is not bound.

Extended resources served by DRA (``core.dra.extended``): the pod's special claim is created
first, as kube-scheduler creates it (``generateName: <pod>-extended-resources-``, the pod as
its controlling owner so the garbage collector deletes it with the pod, the annotation
``resource.kubernetes.io/extended-resource-claim: "true"``, the finalizer, one request per
container and resource), then allocated and reserved like any claim, then the pod's
``status.extendedResourceClaimStatus`` names it and maps each container's resource to its
request, then the bind. A bind that fails deletes the special claim it was for. After a kill -9
the claim is found again by its owner and annotation (``kube.dra.cache``) and reused.

Where it sits: called by ``kube.bind.binder`` with the ``DraPlan`` that ``kube.dra.cache`` made
for the placement. A kill -9 anywhere in between leaves a state the next run reads back: a
claim allocated and reserved for a pending pod (the pod binds there next; if it is deleted,
kube-controller-manager clears the reservation and the allocation), or only a finalizer.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kallot.config.dra import allocation_status
from kallot.core.dra.extended import ANNOTATION as EXTENDED_ANNOTATION
from kallot.core.dra.extended import SUFFIX, ExtendedClaim
from kallot.core.dra.model import ClaimAllocation
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.dra.cache import API, FINALIZER, DraCache, DraPlan

logger = logging.getLogger(__name__)

ATTEMPTS = 5
# After writing allocations and before checking them (``_verify``): wait up to SEEN_TIMEOUT_S
# for our watch to show them (another scheduler's informer, fed by the same API server watch,
# then very likely has them: its later decisions avoid our devices); and where another
# scheduler allocated claims in the last OTHERS_WINDOW_S, SETTLE_S more, so that what it
# decided before it saw our write (kube-scheduler writes a decision from its binding cycle,
# after its scheduling cycle) is written before our check's list begins. docs/dra.md,
# "Scheduler side": the window that remains.
SEEN_TIMEOUT_S = 2.0
SETTLE_S = 1.0
OTHERS_WINDOW_S = 300.0


def claim_path(namespace: str, name: str) -> str:
    return f"{API}/namespaces/{namespace}/resourceclaims/{name}"


def _reserved(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("reservedFor") or [])


def _devices(alloc: ClaimAllocation) -> set[tuple[str, str, str]]:
    return {r.device_id for r in alloc.results if not r.admin_access and not r.share_id}


def conflicting(dra: DraCache, key: str, alloc: ClaimAllocation) -> str:
    """Another claim the watch shows allocated to one of ``alloc``'s exclusive devices (an
    allocation another scheduler wrote after this one was decided): "" when none."""
    mine = _devices(alloc)
    if not mine:
        return ""  # shares and admin access only: nothing another claim can hold exclusively
    for entry in dra.claims():
        other = entry.claim
        if other is None or other.allocation is None or f"{entry.namespace}/{entry.name}" == key:
            continue
        both = mine & _devices(other.allocation)
        if both:
            return f"device {'/'.join(sorted(both)[0])} is allocated to claim {other.key} meanwhile"
    return ""


class FreshClaims:
    """Consistent LISTs of every ResourceClaim, one at a time, shared by the binds that wait for
    one: a bind that wrote allocations waits for a list that began after its write.

    Why: ``conflicting`` checks the watch's view, which may lag behind what another scheduler
    (kube-scheduler) wrote; a list begun after our write shows every allocation written
    before it, so a device found in two allocations then is given back by us before the pod
    is bound (the other scheduler's view can still lag behind ours: that window is the list's
    latency, not the watch's)."""

    def __init__(self) -> None:
        self._task: asyncio.Future[tuple[list[dict[str, Any]], str]] | None = None
        self._started = 0.0

    async def after(self, client: KubeClient, mark: float) -> list[dict[str, Any]]:
        while True:
            task = self._task
            if task is not None and self._started >= mark:
                items, _ = await asyncio.shield(task)
                return items
            if task is not None and not task.done():
                await asyncio.wait([task])
                continue
            self._started = time.monotonic()
            self._task = asyncio.ensure_future(client.list_all(f"{API}/resourceclaims"))


def _taken_elsewhere(items: list[dict[str, Any]], plan: DraPlan, written: list[str]) -> str:
    """A device of an allocation we wrote that another claim holds exclusively too."""
    mine: dict[tuple[str, str, str], str] = {}
    for key in written:
        for device in _devices(plan.allocations[key]):
            mine[device] = key
    ours = {f"{ns}/{name}" for ns, name, _ in plan.claims.values()}
    for obj in items:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        alloc = (obj.get("status") or {}).get("allocation") or {}
        if key in ours or not alloc:
            continue
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r.get("adminAccess") or r.get("shareID"):
                continue
            device = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
            if device in mine:
                return (
                    f"device {'/'.join(device)} is allocated to claim {key} too "
                    f"(written by another scheduler meanwhile)"
                )
    return ""


# One shared list per client (the scheduler has one).
_FRESH: weakref.WeakKeyDictionary[KubeClient, FreshClaims] = weakref.WeakKeyDictionary()


async def _verify(client: KubeClient, plan: DraPlan, written: list[str], mark: float) -> str:
    """After our allocation writes: "" when no other claim holds one of their exclusive
    devices in a consistent list begun after them, else the reason."""
    if not any(_devices(plan.allocations[k]) for k in written):
        return ""  # shares and admin access only
    fresh = _FRESH.setdefault(client, FreshClaims())
    try:
        items = await fresh.after(client, mark)
    except ApiError as exc:
        return f"claims not verified ({exc.message or exc.reason or exc.status})"
    return _taken_elsewhere(items, plan, written)


async def _settle(dra: DraCache, plan: DraPlan, written: list[str]) -> None:
    """Before ``_verify``'s list: our allocations seen by our watch, and another scheduler's
    decisions made without them given time to be written (``SETTLE_S``)."""
    if not any(_devices(plan.allocations[k]) for k in written):
        return  # shares and admin access only: nothing to check
    seen = await dra.seen_allocated(written, SEEN_TIMEOUT_S)
    if time.monotonic() - dra.others_allocated_at < OTHERS_WINDOW_S:
        await asyncio.sleep(SETTLE_S)
    if not seen:
        logger.info("claims not seen on the watch yet claims=%s (checking anyway)", written)


async def _reserve_one(  # noqa: PLR0917
    client: KubeClient,
    key: str,
    ids: tuple[str, str, str],
    alloc: ClaimAllocation | None,
    pod: dict[str, str],
    cached: Mapping[str, Any] | None,
) -> tuple[str, bool]:
    """Finalizer, allocation and reservation of one claim. Returns (problem, wrote the
    allocation). The first try starts from the claim as the watch showed it (``cached``): a
    stale one costs a conflict and a read, a fresh one saves the read."""
    ns, name, uid = ids
    path = claim_path(ns, name)
    for _ in range(ATTEMPTS):
        try:
            obj = copy.deepcopy(dict(cached)) if cached is not None else await client.get(path)
            cached = None
        except ApiError as exc:
            return f"claim {key}: cannot read it ({exc.message or exc.status})", False
        meta = obj.get("metadata") or {}
        if uid and str(meta.get("uid", "")) != uid:
            return f"claim {key}: replaced by a new claim of the same name", False
        if meta.get("deletionTimestamp"):
            return f"claim {key}: being deleted", False
        reserved = _reserved(obj)
        status = obj.get("status") or {}
        if any(r.get("uid") == pod["uid"] for r in reserved):
            return "", False  # done before (a retried bind, or a run before a restart)
        try:
            if alloc is not None:
                if status.get("allocation") is not None:
                    return f"claim {key}: allocated by someone else meanwhile", False
                finalizers = list(meta.get("finalizers") or [])
                if FINALIZER not in finalizers:
                    obj["metadata"]["finalizers"] = [*finalizers, FINALIZER]
                    obj = await client.replace(path, obj)
                obj.setdefault("status", {})["allocation"] = allocation_status(alloc)
            elif status.get("allocation") is None:
                return f"claim {key}: no longer allocated", False
            obj.setdefault("status", {})["reservedFor"] = [*reserved, pod]
            await client.replace(f"{path}/status", obj)
            return "", alloc is not None
        except ApiError as exc:
            if exc.conflict:
                logger.info("claim write conflict, reading again claim=%s pod=%s", key, pod["name"])
                continue  # changed under us: read it again
            return f"claim {key}: {exc.message or exc.reason or exc.status}", False
    return f"claim {key}: still conflicting after {ATTEMPTS} attempts", False


def special_claim_body(ext: ExtendedClaim, namespace: str, pod: str, uid: str) -> dict[str, Any]:
    """The special claim for a pod's extended resources, as kube-scheduler creates it."""
    requests = []
    for r in ext.claim.requests:
        assert r.exactly is not None
        requests.append(
            {
                "name": r.name,
                "exactly": {
                    "deviceClassName": r.exactly.device_class,
                    "allocationMode": "ExactCount",
                    "count": r.exactly.count,
                },
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod}{SUFFIX}-",
            "namespace": namespace,
            "annotations": {EXTENDED_ANNOTATION: "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid, "controller": True}
            ],
            "finalizers": [FINALIZER],
        },
        "spec": {"devices": {"requests": requests}},
    }


def claim_status(ext: ExtendedClaim, claim_name: str) -> dict[str, Any]:
    """The pod's ``status.extendedResourceClaimStatus``."""
    return {
        "resourceClaimName": claim_name,
        "requestMappings": [
            {"containerName": m.container, "resourceName": m.resource, "requestName": m.request}
            for m in ext.mappings
        ],
    }


async def _create_special(
    client: KubeClient, dra: DraCache, plan: DraPlan, *, namespace: str, name: str, uid: str
) -> tuple[DraPlan, str]:
    """Create the plan's special claim; the plan with its key and name then, or the reason."""
    ext = plan.extended
    assert ext is not None
    body = special_claim_body(ext, namespace, name, uid)
    try:
        obj = await client.create(f"{API}/namespaces/{namespace}/resourceclaims", body)
    except ApiError as exc:
        why = exc.message or exc.reason or str(exc.status)
        return plan, f"extended resource {ext.describe()}: cannot create its claim ({why})"
    dra.apply_claim("ADDED", obj)  # found by its owner from now on, also after a restart
    meta = obj.get("metadata") or {}
    new = f"{namespace}/{meta.get('name', '')}"
    old = plan.special
    dra.created(uid, old, new)
    claims = {(new if k == old else k): v for k, v in plan.claims.items()}
    claims[new] = (namespace, str(meta.get("name", "")), str(meta.get("uid", "")))
    allocations = {(new if k == old else k): a for k, a in plan.allocations.items()}
    reserve = tuple(new if k == old else k for k in plan.reserve)
    logger.info("claim created for extended resources claim=%s pod=%s", new, name)
    return dataclasses.replace(
        plan, claims=claims, allocations=allocations, reserve=reserve, special=new
    ), ""


async def prebind(
    client: KubeClient, dra: DraCache, plan: DraPlan, *, namespace: str, name: str, uid: str
) -> str:
    """Write the plan's claims for the pod; "" when every claim is allocated and reserved for
    it, else the reason (what was written is undone first)."""
    pod = {"resource": "pods", "name": name, "uid": uid}
    written: list[str] = []
    reserved: list[str] = []
    if plan.special and not plan.claims[plan.special][1]:
        plan, problem = await _create_special(
            client, dra, plan, namespace=namespace, name=name, uid=uid
        )
        if problem:
            return problem
    for key in [*plan.allocations, *plan.reserve]:
        alloc = plan.allocations.get(key)
        problem, wrote = "", False
        if alloc is not None:
            problem = conflicting(dra, key, alloc)
        if not problem:
            entry = dra.claim(key)
            cached = entry.raw if entry is not None else None
            problem, wrote = await _reserve_one(client, key, plan.claims[key], alloc, pod, cached)
        if problem:
            logger.info("claims not written pod=%s/%s why=%s (undoing)", namespace, name, problem)
            await undo(client, plan, uid, keys=reserved, written=written)
            return problem
        reserved.append(key)
        if wrote:
            written.append(key)
    if written:
        await _settle(dra, plan, written)
        problem = await _verify(client, plan, written, time.monotonic())
        if problem:
            logger.info("claims given back pod=%s/%s why=%s (undoing)", namespace, name, problem)
            await undo(client, plan, uid, keys=reserved, written=written)
            return problem
    if plan.extended is not None and plan.special:
        status = claim_status(plan.extended, plan.claims[plan.special][1])
        patch = {"metadata": {"uid": uid}, "status": {"extendedResourceClaimStatus": status}}
        try:
            got = await client.patch_pod_status(namespace, name, patch)
            problem = ""
            if not (got.get("status") or {}).get("extendedResourceClaimStatus"):
                # An API server without the DRAExtendedResource gate drops the field: the
                # kubelet would never learn which devices the containers get.
                problem = (
                    "pod status.extendedResourceClaimStatus not kept by the API server "
                    "(feature gate DRAExtendedResource off?)"
                )
        except ApiError as exc:
            problem = f"pod status: {exc.message or exc.reason or exc.status}"
        if problem:
            logger.info("claims not written pod=%s/%s why=%s (undoing)", namespace, name, problem)
            await undo(client, plan, uid, keys=reserved, written=written)
            return problem
    return ""


async def undo(
    client: KubeClient,
    plan: DraPlan,
    uid: str,
    *,
    keys: list[str] | None = None,
    written: list[str] | None = None,
) -> None:
    """Take the pod out of ``reservedFor`` of the plan's claims (``keys``: only those) and
    clear the allocations it wrote (``written``; all the plan's new ones when None) that
    nobody else reserves."""
    keys = list(plan.claims) if keys is None else keys
    ours = set(plan.allocations) if written is None else set(written)
    for key in keys:
        ns, name, claim_uid = plan.claims[key]
        if not name:
            continue  # a special claim never created
        path = claim_path(ns, name)

        async def give_back(obj: dict[str, Any], key: str = key, path: str = path) -> None:
            reserved = _reserved(obj)
            left = [r for r in reserved if r.get("uid") != uid]
            status = obj.setdefault("status", {})
            clear = key in ours and not left and status.get("allocation") is not None
            if len(left) == len(reserved) and not clear:
                return
            status["reservedFor"] = left or None
            if clear:
                status["allocation"] = None
            await client.replace(f"{path}/status", obj)
            logger.info("claim given back claim=%s pod=%s deallocated=%s", key, uid, clear)

        await _rewrite_claim(client, path, claim_uid, give_back, f"undo claim={key} pod={uid}")
    if plan.special and plan.claims[plan.special][1]:
        await _delete_special(client, plan, uid)


async def _delete_special(client: KubeClient, plan: DraPlan, uid: str) -> None:
    """The special claim of a pod that is not bound goes (kube-scheduler's Unreserve deletes
    it too): deleted, and its finalizer removed once nobody reserves it and it is not
    allocated (else the resourceclaim controller removes it after deallocating)."""
    ns, name, claim_uid = plan.claims[plan.special]
    path = claim_path(ns, name)

    async def delete(obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        if status.get("reservedFor") or status.get("allocation") is not None:
            return  # someone (a newer bind of the pod) holds it: keep it
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER in finalizers:
            obj["metadata"]["finalizers"] = [f for f in finalizers if f != FINALIZER]
            await client.replace(path, obj)
        if not meta.get("deletionTimestamp"):
            await client.delete(path)
        logger.info("special claim deleted claim=%s pod=%s", plan.special, uid)

    await _rewrite_claim(client, path, claim_uid, delete, f"delete claim={plan.special} pod={uid}")


async def _rewrite_claim(
    client: KubeClient,
    path: str,
    claim_uid: str,
    change: Callable[[dict[str, Any]], Awaitable[None]],
    what: str,
) -> None:
    """Read the claim and ``change`` it (``change`` writes) while it is the claim of the plan
    (``claim_uid``); a conflict reads it again, up to ``ATTEMPTS`` times. A claim gone (404)
    needs nothing; another error is logged (undoing is best effort)."""
    for _ in range(ATTEMPTS):
        try:
            obj = await client.get(path)
            if claim_uid and str((obj.get("metadata") or {}).get("uid", "")) != claim_uid:
                return
            await change(obj)
            return
        except ApiError as exc:
            if exc.conflict:
                continue
            if not exc.not_found:
                logger.warning("cannot %s error=%s", what, exc)
            return
