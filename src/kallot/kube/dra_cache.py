"""The live scheduler's DRA state: DeviceClasses, ResourceSlices and ResourceClaims from the
watch, the allocations kallot has decided but the watch does not show yet, and each pending
pod's claims resolved for the session.

Where it sits: reflectors (``kube.reflector``) feed ``apply_*`` / ``replace_*``; before a
session the controller calls ``attach`` so that every task whose pod has ``spec.resourceClaims``
carries ``PodInfo.dra`` (the claims as they are now and one ``Inventory`` shared by the
session) for the core's ``DraAllocation`` plugin; after the session ``plan`` recomputes each
placed pod's allocation on its node (in placement order, on the newest state) and holds it as
in flight (``assumed``) until the watch shows the claim allocated, or the bind gives it back
(``drop``). Every claim allocated by anyone (kube-scheduler included) occupies its devices;
pools count only when complete at their newest generation (``core.dra.model.assemble_pools``).

Restart safety: nothing here outlives the process but what the API holds. An allocation kallot
wrote before a kill -9 is read back from the claim (it occupies its devices; the pod it is
reserved for finds it allocated and only binds).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core.dra.allocator import Inventory
from kallot.core.dra.model import ClaimAllocation, DeviceClass, ResourceClaim, Slice, assemble_pools
from kallot.core.dra.pod import PodClaimRef, PodClaims
from kallot.core.errors import ConfigError
from kallot.core.plugins.dra_fit import allocate_on, by_node, node_inventory
from kallot.core.workload import Task

logger = logging.getLogger(__name__)

API = "/apis/resource.k8s.io/v1"
DEVICE_CLASSES = f"{API}/deviceclasses"
RESOURCE_SLICES = f"{API}/resourceslices"
RESOURCE_CLAIMS = f"{API}/resourceclaims"
# What kube-scheduler puts on a claim before it allocates it (the resourceclaim controller
# removes it once the claim is deallocated and deleted).
FINALIZER = "resource.kubernetes.io/delete-protection"
MEMO_MAX = 200_000
# On a claim the resourceclaim controller generated from a template: which entry of the owning
# pod's spec.resourceClaims it is for (with an ownerReference to the pod).
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


@dataclass(slots=True)
class ClaimEntry:
    namespace: str
    name: str
    uid: str
    claim: ResourceClaim | None  # None when it does not parse
    error: str = ""
    deleting: bool = False
    raw: Mapping[str, Any] | None = None  # as the watch last showed it (first write's base)


@dataclass(frozen=True, slots=True)
class DraPlan:
    """What the bind of one pod writes: new allocations (claim key -> allocation) and the
    claims already allocated that only get the pod in ``reservedFor``."""

    node: str
    allocations: Mapping[str, ClaimAllocation]
    reserve: tuple[str, ...]
    claims: Mapping[str, tuple[str, str, str]]  # claim key -> (namespace, name, uid)


class DraCache:
    """Not thread-safe: every method runs on the event loop."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._classes: dict[str, DeviceClass] = {}
        self._class_errors: dict[str, str] = {}
        self._slices: dict[str, Slice] = {}
        self.slice_errors: dict[str, str] = {}
        self._claims: dict[str, ClaimEntry] = {}
        # (namespace, owning pod uid, pod claim name) -> generated claim name: a pod's claim is
        # found as soon as it exists, before the controller writes the pod's status.
        self._generated: dict[tuple[str, str, str], str] = {}
        #: claim key -> allocation kallot decided, not yet seen on the claim
        self.assumed: dict[str, ClaimAllocation] = {}
        #: pod uid -> what its bind writes
        self.plans: dict[str, DraPlan] = {}
        self._suspect: set[str] = set()  # in flight, unallocated at the last full list
        self._inventory: Inventory | None = None
        self._pools_stale = True
        self._pools: list[Any] = []
        self.skipped_pools: list[str] = []
        # DraAllocation's answers by claims and node state, kept across sessions (bounded).
        self.memo: dict[Any, Any] = {}

    def _changed(self, pools: bool = False) -> None:
        self._inventory = None
        if pools:
            self._pools_stale = True
        self._on_change()

    # -- watch handlers ---------------------------------------------------------------------

    def apply_class(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        self._classes.pop(name, None)
        self._class_errors.pop(name, None)
        if event != "DELETED":
            try:
                self._classes[name] = device_class_from_json(obj)
            except ConfigError as exc:
                self._class_errors[name] = str(exc)
                logger.warning("invalid DeviceClass class=%s error=%s", name, exc)
        self._changed()

    def replace_classes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._classes.clear()
        self._class_errors.clear()
        for obj in items:
            self.apply_class("ADDED", obj)
        self._changed()

    def apply_slice(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        self._slices.pop(name, None)
        self.slice_errors.pop(name, None)
        if event != "DELETED":
            try:
                self._slices[name] = slice_from_json(obj)
            except ConfigError as exc:
                self.slice_errors[name] = str(exc)
                logger.warning("invalid ResourceSlice slice=%s error=%s", name, exc)
        self._changed(pools=True)

    def replace_slices(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._slices.clear()
        self.slice_errors.clear()
        for obj in items:
            self.apply_slice("ADDED", obj)
        self._changed(pools=True)

    def apply_claim(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        key = f"{ns}/{name}"
        generated = _generated_for(ns, name, meta)
        if event == "DELETED":
            self._claims.pop(key, None)
            self.assumed.pop(key, None)
            if generated is not None:
                self._generated.pop(generated, None)
            self._changed()
            return
        if generated is not None:
            self._generated[generated] = name
        entry = ClaimEntry(ns, name, str(meta.get("uid", "")), None, raw=obj)
        entry.deleting = bool(meta.get("deletionTimestamp"))
        try:
            entry.claim = claim_from_json(obj)
        except ConfigError as exc:
            entry.error = str(exc)
        self._claims[key] = entry
        if (obj.get("status") or {}).get("allocation") is not None:
            self.assumed.pop(key, None)  # the API shows an allocation: it is the truth now
        self._changed()

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: in-flight allocations of claims that are gone are dropped. One whose
        bind finished but that the list shows unallocated is kept until the next list (the list
        may predate the write, whose watch event then follows); still unallocated then, it was
        given back meanwhile (the watch collapsed over a re-list) and is dropped."""
        self._claims.clear()
        self._generated.clear()
        for obj in items:
            self.apply_claim("ADDED", obj)
        running = {key for plan in self.plans.values() for key in plan.allocations}
        keep: dict[str, ClaimAllocation] = {}
        suspect: set[str] = set()
        for key, alloc in self.assumed.items():
            if key not in self._claims:
                continue
            if key in running or key not in self._suspect:
                keep[key] = alloc
                if key not in running:
                    suspect.add(key)
        self.assumed, self._suspect = keep, suspect
        self._changed()

    # -- reading ---------------------------------------------------------------------------

    def claim(self, key: str) -> ClaimEntry | None:
        return self._claims.get(key)

    def claims(self) -> Iterable[ClaimEntry]:
        return self._claims.values()

    def inventory(self) -> Inventory:
        """Complete pools, valid classes, and every allocation (the API's and in flight)."""
        if self._inventory is not None:
            return self._inventory
        if self._pools_stale:
            self._pools, self.skipped_pools = assemble_pools(list(self._slices.values()))
            self._pools_stale = False
        allocated: list[ClaimAllocation] = []
        for key, entry in self._claims.items():
            if entry.claim is not None and entry.claim.allocation is not None:
                allocated.append(entry.claim.allocation)
            elif key in self.assumed:
                allocated.append(self.assumed[key])
        allocated.extend(a for k, a in self.assumed.items() if k not in self._claims)
        self._inventory = Inventory(tuple(self._pools), dict(self._classes), tuple(allocated))
        return self._inventory

    def pod_claims(
        self, namespace: str, refs: Sequence[PodClaimRef], pod_uid: str = ""
    ) -> PodClaims:
        """The pod's claims now, or the first reason they cannot be allocated anywhere."""
        inventory = self.inventory()
        claims: list[ResourceClaim] = []
        for ref in refs:
            if not ref.claim and ref.template:
                made = self._generated.get((namespace, pod_uid, ref.name))
                if made:
                    ref = dataclasses.replace(ref, claim=made)  # noqa: PLW2901
            if not ref.claim:
                return PodClaims(
                    (),
                    inventory,
                    f"pod claim {ref.name}: waiting for its ResourceClaim from template "
                    f"{ref.template} (kube-controller-manager creates it)",
                )
            key = f"{namespace}/{ref.claim}"
            entry = self._claims.get(key)
            if entry is None:
                return PodClaims((), inventory, f"claim {key}: ResourceClaim not found")
            if entry.claim is None:
                return PodClaims((), inventory, entry.error)
            if entry.deleting:
                return PodClaims((), inventory, f"claim {key}: being deleted")
            claim = entry.claim
            if claim.allocation is None and key in self.assumed:
                claim = dataclasses.replace(claim, allocation=self.assumed[key])
            if claim.allocation is None:
                for request in claim.requests:
                    for name, alt in request.alternatives():
                        err = self._class_errors.get(alt.device_class)
                        if err:
                            return PodClaims((), inventory, f"claim {key}, request {name}: {err}")
            claims.append(claim)
        return PodClaims(tuple(claims), inventory, memo=self.memo)

    # -- sessions ----------------------------------------------------------------------------

    def attach(self, tasks: Sequence[Task]) -> list[Task]:
        """The session's tasks, each pod with claims carrying ``PodInfo.dra``."""
        if len(self.memo) > MEMO_MAX:
            self.memo = {}
        out = []
        for task in tasks:
            k = task.k8s
            if k is not None and k.resource_claims:
                dra = self.pod_claims(k.namespace, k.resource_claims, task.id)
                out.append(dataclasses.replace(task, k8s=dataclasses.replace(k, dra=dra)))
            else:
                out.append(task)
        return out

    def plan(
        self, uid: str, task: Task, node: str, labels: Mapping[str, str]
    ) -> tuple[DraPlan | None, str]:
        """The placed pod's allocation on ``node`` on the newest state (what this and earlier
        placements assumed included); held as in flight. (None, reason) when it no longer fits:
        the pod is decided again by the next session."""
        k = task.k8s
        if k is None or not k.resource_claims:
            return None, ""
        dra = self.pod_claims(k.namespace, k.resource_claims, uid)
        if dra.error:
            return None, dra.error
        local = node_inventory(by_node(dra.inventory), node)
        outcome = allocate_on(dra, node, labels, local, (), {})
        if not outcome.ok:
            return None, outcome.reason
        claims = {c.key: (c.namespace, c.name, c.uid) for c in dra.claims}
        plan = DraPlan(node, dict(outcome.allocations), outcome.reserve_only, claims)
        self.plans[uid] = plan
        for key, alloc in plan.allocations.items():
            self.assumed[key] = alloc
        self._changed()
        return plan, ""

    def drop(self, uid: str, *, allocations: bool) -> None:
        """The bind of ``uid`` is over: forget its plan, and (``allocations``: it failed and
        was undone) the allocations it held in flight."""
        plan = self.plans.pop(uid, None)
        if plan is None or not allocations:
            return
        for key in plan.allocations:
            self.assumed.pop(key, None)
        self._changed()


def _generated_for(
    namespace: str, name: str, meta: Mapping[str, Any]
) -> tuple[str, str, str] | None:
    pod_claim = (meta.get("annotations") or {}).get(POD_CLAIM_NAME)
    if not pod_claim:
        return None
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("controller"):
            return (namespace, str(owner.get("uid", "")), str(pod_claim))
    return None
