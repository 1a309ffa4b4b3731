"""The live scheduler's DRA state: DeviceClasses, ResourceSlices and ResourceClaims from the
watch, the allocations kallot has decided but the watch does not show yet, and each pending
pod's claims resolved for the session.

Where it sits: reflectors (``kube.watch.reflector``) feed ``apply_*`` / ``replace_*``; before a
session the controller calls ``attach`` so that every task whose pod has ``spec.resourceClaims``
carries ``PodInfo.dra`` (the claims as they are now and one ``Inventory`` shared by the
session) for the core's ``DraAllocation`` plugin; after the session ``reserve`` takes each
placed pod's claim allocations from the Decision (``Placement.claims``: chosen once, in the
session, by the policy that scored them), checks that nothing they were decided on changed
meanwhile, and holds them as in flight (``assumed``) until the watch shows the claim
allocated, or the bind gives them back (``drop``). Every claim allocated by anyone (kube-scheduler included) occupies its devices;
pools count only when complete at their newest generation (``core.dra.model.assemble_pools``).

Restart safety: nothing here outlives the process but what the API holds. An allocation kallot
wrote before a kill -9 is read back from the claim (it occupies its devices; the pod it is
reserved for finds it allocated and only binds).

Extended resources backed by a DeviceClass (``core.dra.extended``): a pod asking e.g.
``nvidia.com/gpu`` is served by its device plugin on the nodes that advertise the resource in
their allocatable, and by DRA through a special claim on the others. ``attach`` gives the
session one of the two per pod (the session's task has no GPU request and carries the
special claim when DRA serves it): DRA when no node advertises the resource, else the device
plugin first, and DRA in the next session when that found no place (``unschedulable``). A
special claim that exists already (a bind cut short by a restart) is found by its owner and
annotation and reused.

Long module: claims, slices, classes, in-flight allocations and the special claims of
extended resources are one state that ``attach`` and ``reserve`` read together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kallot.config import wire
from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core.decision import ClaimDecision, Placement
from kallot.core.dra.allocator import Inventory
from kallot.core.dra.extended import ANNOTATION as EXTENDED_ANNOTATION
from kallot.core.dra.extended import ExtendedClaim, extended_claim
from kallot.core.dra.model import (
    ClaimAllocation,
    DeviceClass,
    Pool,
    ResourceClaim,
    Slice,
    assemble_pools,
    incomplete_pools,
)
from kallot.core.dra.pod import PodClaimRef, PodClaims
from kallot.core.errors import ConfigError
from kallot.core.workload import Task
from kallot.kube.translate.quantity import parse_quantity

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
    # The pod's special claim for extended resources served by DRA (its key in ``claims``:
    # the in-memory name and no uid until the bind creates it).
    extended: ExtendedClaim | None = None
    special: str = ""  # the special claim's key in ``claims`` ("" when none)


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
        # (namespace, owning pod uid) -> name of the pod's special claim (extended resources).
        self._specials: dict[tuple[str, str], str] = {}
        # node name -> the extended resources its allocatable names (device plugins).
        self._node_resources: dict[str, frozenset[str]] = {}
        # resources -> the nodes advertising any of them (until a node's resources change).
        self._plugin_nodes: dict[frozenset[str], frozenset[str]] = {}
        #: pod uid -> the special claim the session's task carries (DRA serves it)
        self.extended: dict[str, ExtendedClaim] = {}
        # Pods whose device-plugin placement found no node: DRA's turn next session (with
        # the reason the device plugin's turn gave).
        self._dra_turn: dict[str, str] = {}
        # Pods the session gives to the device plugin though DRA could serve them too.
        self._plugin_turn: set[str] = set()
        #: claim key -> allocation kallot decided, not yet seen on the claim
        self.assumed: dict[str, ClaimAllocation] = {}
        #: pod uid -> what its bind writes
        self.plans: dict[str, DraPlan] = {}
        # The inventory the last session was given (``attach``) and the allocations reserved
        # from its Decision so far: what ``reserve`` checks each decided allocation against.
        self._session: Inventory | None = None
        self._reserved: list[ClaimAllocation] = []
        self._suspect: set[str] = set()  # in flight, unallocated at the last full list
        self._inventory: Inventory | None = None
        self._pools_stale = True
        self._pools: tuple[Any, ...] = ()  # one tuple per assembly
        self._incomplete: tuple[Pool, ...] = ()  # pools missing slices (All fails on them)
        self.skipped_pools: list[str] = []
        # DraAllocation's answers by claims and node state, kept across sessions (bounded).
        self.memo: dict[Any, Any] = {}
        #: when (time.monotonic) the watch last showed a claim newly allocated by someone
        #: else (not in ``assumed``): another scheduler allocates claims here (the bind then
        #: waits ``kube.bind.claims.SETTLE_S`` before its check); -inf: never
        self.others_allocated_at = float("-inf")
        self._listing = False
        # Binds waiting for the watch to show their allocations (``seen_allocated``).
        self._waiters: list[tuple[frozenset[str], asyncio.Future[None]]] = []

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
        special = _special_for(ns, meta)
        if event == "DELETED":
            self._claims.pop(key, None)
            self.assumed.pop(key, None)
            if generated is not None:
                self._generated.pop(generated, None)
            if special is not None and self._specials.get(special) == name:
                del self._specials[special]
            self._changed()
            return
        if generated is not None:
            self._generated[generated] = name
        if special is not None:
            self._specials[special] = name
        entry = ClaimEntry(ns, name, str(meta.get("uid", "")), None, raw=obj)
        entry.deleting = bool(meta.get("deletionTimestamp"))
        try:
            entry.claim = claim_from_json(obj)
        except ConfigError as exc:
            entry.error = str(exc)
        before = self._claims.get(key)
        self._claims[key] = entry
        if (obj.get("status") or {}).get("allocation") is not None:
            was = (
                before is not None
                and before.raw is not None
                and bool((before.raw.get("status") or {}).get("allocation"))
            )
            if not was and not self._listing and key not in self.assumed:
                self.others_allocated_at = time.monotonic()
            self.assumed.pop(key, None)  # the API shows an allocation: it is the truth now
            if self._waiters:
                self._wake()
        self._changed()

    def _wake(self) -> None:
        allocated = {
            k
            for k, e in self._claims.items()
            if e.raw is not None and (e.raw.get("status") or {}).get("allocation")
        }
        left = []
        for keys, fut in self._waiters:
            if keys <= allocated:
                if not fut.done():
                    fut.set_result(None)
            elif not fut.done():
                left.append((keys, fut))
        self._waiters = left

    async def seen_allocated(self, keys: Iterable[str], timeout: float) -> bool:
        """Wait until the watch shows every claim of ``keys`` allocated (at most ``timeout``
        seconds): whether it did. Why: another scheduler's informer is fed by the same API
        server watch, so once ours shows an allocation, its view very likely does too."""
        want = frozenset(keys)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((want, fut))
        self._wake()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return False
        finally:
            self._waiters = [(k, f) for k, f in self._waiters if f is not fut]
        return True

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: in-flight allocations of claims that are gone are dropped. One whose
        bind finished but that the list shows unallocated is kept until the next list (the list
        may predate the write, whose watch event then follows); still unallocated then, it was
        given back meanwhile (the watch collapsed over a re-list) and is dropped."""
        self._claims.clear()
        self._generated.clear()
        self._specials.clear()
        self._listing = True  # a list is no news of who allocates now
        try:
            for obj in items:
                self.apply_claim("ADDED", obj)
        finally:
            self._listing = False
        if self._waiters:
            self._wake()
        running = {key for plan in self.plans.values() for key in plan.allocations}
        keep: dict[str, ClaimAllocation] = {}
        suspect: set[str] = set()
        for key, alloc in self.assumed.items():
            if key not in self._claims and key not in running:
                continue  # gone (a special claim not created yet is in ``running``)
            if key in running or key not in self._suspect:
                keep[key] = alloc
                if key not in running:
                    suspect.add(key)
        self.assumed, self._suspect = keep, suspect
        self._changed()

    def apply_node(self, event: str, obj: Mapping[str, Any]) -> None:
        """Which extended resources a node advertises (a device plugin serves them there):
        those above 0 in its allocatable. kube-scheduler v1.36 serves a resource at ``0`` by
        DRA (tests/dra/test_dra_extended.py checks it)."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        before = self._node_resources.pop(name, None)
        if event != "DELETED":
            status = obj.get("status") or {}
            alloc = status.get("allocatable") or status.get("capacity") or {}
            self._node_resources[name] = frozenset(
                str(k) for k, v in alloc.items() if "/" in str(k) and _positive(v)
            )
        if self._node_resources.get(name) != before:
            self._plugin_nodes = {}

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._node_resources.clear()
        self._plugin_nodes = {}
        for obj in items:
            self.apply_node("ADDED", obj)

    def _advertising(self, resources: frozenset[str]) -> frozenset[str]:
        """The nodes that advertise any of ``resources`` (computed once per node change)."""
        got = self._plugin_nodes.get(resources)
        if got is None:
            got = frozenset(n for n, keys in self._node_resources.items() if keys & resources)
            self._plugin_nodes[resources] = got
        return got

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
            slices = list(self._slices.values())
            pools, self.skipped_pools = assemble_pools(slices)
            self._pools = tuple(pools)
            self._incomplete = incomplete_pools(slices)
            self._pools_stale = False
        allocated: list[ClaimAllocation] = []
        for key, entry in self._claims.items():
            if entry.claim is not None and entry.claim.allocation is not None:
                allocated.append(entry.claim.allocation)
            elif key in self.assumed:
                allocated.append(self.assumed[key])
        allocated.extend(a for k, a in self.assumed.items() if k not in self._claims)
        self._inventory = Inventory(
            self._pools, dict(self._classes), tuple(allocated), self._incomplete
        )
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
        """The session's tasks, each pod with claims carrying ``PodInfo.dra``; a pod whose
        extended resources DRA serves this session without its GPU request or those
        resources, and with its special claim."""
        if len(self.memo) > MEMO_MAX:
            self.memo = {}
        # What the session decides on: ``reserve`` checks each decision against it.
        self._session = self.inventory()
        self._reserved = []
        out = []
        self.extended = {}
        self._plugin_turn = set()
        for task in tasks:
            k = task.k8s
            ext = self._extended_for(task) if k is not None and k.container_requests else None
            if k is not None and ext is not None:
                self.extended[task.id] = ext
                dra = self._with_extended(
                    self.pod_claims(k.namespace, k.resource_claims, task.id), task.id, ext
                )
                scalars = {r: v for r, v in k.scalars.items() if r not in ext.resources}
                gpu = None if wire.RESOURCE_GPU in ext.resources else task.gpu
                k = dataclasses.replace(k, dra=dra, scalars=scalars)
                out.append(dataclasses.replace(task, gpu=gpu, k8s=k))
            elif k is not None and k.resource_claims:
                dra = self.pod_claims(k.namespace, k.resource_claims, task.id)
                out.append(dataclasses.replace(task, k8s=dataclasses.replace(k, dra=dra)))
            else:
                out.append(task)
        return out

    def _extended_for(self, task: Task) -> ExtendedClaim | None:
        """The pod's special claim when DRA serves its extended resources this session."""
        k = task.k8s
        assert k is not None
        ext = extended_claim(k.namespace, task.id, k.container_requests, self._classes)
        if ext is None:
            return None
        plugin = len(self._advertising(ext.resources))
        if plugin == len(self._node_resources):
            return None  # every node serves them by device plugin
        existing = self._specials.get((k.namespace, task.id))
        if plugin and not existing and task.id not in self._dra_turn:
            self._plugin_turn.add(task.id)
            return None  # the device plugin's turn
        return ext

    def _with_extended(self, dra: PodClaims, uid: str, ext: ExtendedClaim) -> PodClaims:
        """``dra`` with the pod's special claim (the one the API holds, else a new one) and
        the nodes that serve its resources by device plugin left out."""
        namespace = ext.claim.namespace
        off = self._advertising(ext.resources)
        claim = ext.claim
        existing = self._specials.get((namespace, uid))
        if existing:
            entry = self._claims.get(f"{namespace}/{existing}")
            if entry is not None and entry.claim is None:
                return dataclasses.replace(dra, error=entry.error, off_nodes=off)
            if entry is not None and entry.claim is not None:
                claim = entry.claim
                if entry.deleting:
                    why = f"claim {claim.key}: being deleted"
                    return dataclasses.replace(dra, error=why, extended=ext, off_nodes=off)
        if claim.allocation is None and claim.key in self.assumed:
            claim = dataclasses.replace(claim, allocation=self.assumed[claim.key])
        ext = dataclasses.replace(ext, claim=claim)
        claims = dra.claims if dra.error else (*dra.claims, claim)
        return dataclasses.replace(dra, claims=claims, extended=ext, off_nodes=off)

    def unschedulable(self, uid: str, message: str) -> str | None:
        """The session found no place for ``uid`` (``message`` says why): None when it is to
        be tried again at once the other way (its extended resources by DRA after the device
        plugin's turn), else what to report (both turns' reasons when both were tried)."""
        if uid in self.extended:
            first = self._dra_turn.pop(uid, "")  # the device plugin first next time
            return f"{message}; by device plugin: {first}" if first else message
        if uid not in self._plugin_turn:
            return message
        if len(self._dra_turn) > MEMO_MAX:
            self._dra_turn.clear()  # pods deleted on their turn: a turn lost, never a leak
        self._dra_turn[uid] = message
        return None

    def reserve(self, uid: str, task: Task, placement: Placement) -> tuple[DraPlan | None, str]:
        """Reserve, the shell's half: the placed pod's claim allocations exactly as the session
        decided them (``placement.claims``), held in flight for the bind. Nothing is decided
        here. (None, reason) when what they were decided on changed since the session's input
        was taken (a claim allocated or given back meanwhile, a device of theirs taken, their
        pool or class changed): the pod is decided again by the next session."""
        k = task.k8s
        ext = self.extended.get(uid)
        if k is None or (not k.resource_claims and ext is None):
            return None, ""
        decided = placement.claims
        if decided is None:
            return None, "the session decided no claim allocations for it"
        dra = self.pod_claims(k.namespace, k.resource_claims, uid)
        if ext is not None:
            dra = self._with_extended(dra, uid, ext)
            ext = dra.extended
        if dra.error:
            return None, dra.say(dra.error)
        problem = self._changed_under(dra, decided)
        if problem:
            return None, dra.say(f"{problem} since the session decided (on node {placement.node})")
        claims = {
            c.key: (
                c.namespace,
                "" if ext and c.key == ext.claim.key and not c.uid else c.name,
                c.uid,
            )
            for c in dra.claims
        }
        special = ext.claim.key if ext is not None else ""
        plan = DraPlan(
            placement.node, dict(decided.allocations), decided.reserve, claims, ext, special
        )
        self.plans[uid] = plan
        for key, alloc in plan.allocations.items():
            self.assumed[key] = alloc
        self._reserved.extend(plan.allocations.values())
        self._changed()
        return plan, ""

    def _changed_under(self, dra: PodClaims, decided: ClaimDecision) -> str:
        """What changed under a decided allocation since the session's input (``attach``), or
        "". Only additions can invalidate it: devices, counters and capacity freed meanwhile
        leave it valid, so the check is that every device use on its pools now was there
        then (the session's input plus what this hand-off reserved before it)."""
        now = {c.key: c for c in dra.claims}
        for key in (*decided.allocations, *decided.reserve):
            if key not in now:
                return f"claim {key}: no longer one of the pod's claims"
        for c in dra.claims:
            if c.allocation is None and c.key not in decided.allocations:
                return f"claim {c.key}: no longer allocated"
            if c.allocation is not None and c.key in decided.allocations:
                return f"claim {c.key}: allocated meanwhile"
        base = self._session
        if base is None or not decided.allocations:
            return ""
        inv = dra.inventory
        classes = {
            alt.device_class
            for c in dra.claims
            if c.key in decided.allocations
            for request in c.requests
            for _, alt in request.alternatives()
        }
        for name in classes:
            if inv.classes.get(name) is not base.classes.get(name):
                return f"DeviceClass {name}: changed"
        used = {(r.driver, r.pool) for a in decided.allocations.values() for r in a.results}
        then = {(p.driver, p.name): p.generation for p in base.pools if (p.driver, p.name) in used}
        for p in inv.pools:
            if (p.driver, p.name) in used and then.pop((p.driver, p.name), None) != p.generation:
                return f"pool {p.driver}/{p.name}: changed"
        if then:
            return f"pool {'/'.join(sorted(then)[0])}: gone"
        held_then = _held((*base.allocated, *self._reserved), used)
        for use, count in _held(inv.allocated, used).items():
            if count > held_then[use]:
                return f"device {'/'.join(use[:3])}: taken"
        return ""

    def created(self, uid: str, old: str, new: str) -> None:
        """The bind of ``uid`` created its special claim: its in-flight allocation moves from
        the in-memory key ``old`` to the claim's ``new`` key."""
        plan = self.plans.get(uid)
        if plan is not None and old in plan.claims:
            allocations = {(new if k == old else k): a for k, a in plan.allocations.items()}
            claims = {(new if k == old else k): v for k, v in plan.claims.items()}
            self.plans[uid] = dataclasses.replace(
                plan, allocations=allocations, claims=claims, special=new
            )
        alloc = self.assumed.pop(old, None)
        entry = self._claims.get(new)
        if alloc is not None and (
            entry is None or entry.claim is None or entry.claim.allocation is None
        ):
            self.assumed[new] = alloc
        self._changed()

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


def _special_for(namespace: str, meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, owning pod uid) of a special claim for extended resources, else None."""
    if (meta.get("annotations") or {}).get(EXTENDED_ANNOTATION) != "true":
        return None
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("controller"):
            return (namespace, str(owner.get("uid", "")))
    return None


def _held(
    allocations: Iterable[ClaimAllocation], pools: set[tuple[str, str]]
) -> Counter[tuple[str, str, str, tuple[tuple[str, Any], ...]]]:
    """Device uses on ``pools`` by content: (driver, pool, device, consumed capacity), each
    as many times as it is held (admin access holds nothing)."""
    return Counter(
        (r.driver, r.pool, r.device, tuple(sorted(r.consumed.items())))
        for alloc in allocations
        for r in alloc.results
        if (r.driver, r.pool) in pools and not r.admin_access
    )


def _positive(value: object) -> bool:
    """A quantity above 0 (a malformed one counts: the device plugin keeps the node)."""
    try:
        return parse_quantity(value, "status.allocatable") > 0
    except ConfigError:
        return True
