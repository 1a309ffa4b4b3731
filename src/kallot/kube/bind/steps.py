"""The PreBind steps of the binding cycle, each with its undo, after kube-scheduler's PreBind
plugins (VolumeBinding, DynamicResources) and KAI's binder plugins.

Where it sits: ``kube.bind.binder`` runs one ``BindCycle`` per placement the controller
reserved (``Cache.assume``, and ``DraCache.reserve`` for its claims): every step's
``pre_bind`` in order, then the Bind (``pods/binding``: ``spec.nodeName`` and the device
record in one write). The cycle ends in one of two ways, decided only by the cache's truth
(the binder's rule: a read-back of the pod, not a failed request, says it is not bound):

- the pod is bound (or still assumed on that node): every step's ``bound``, in order;
- it is not: every step's ``undo``, newest first, whatever failed (a step, the Bind, a pod
  deleted before its bind) and wherever. A step that wrote nothing does nothing; a step whose
  ``pre_bind`` failed half-way has recorded what it wrote, so its undo takes that back too.

The default cycle (``default_steps``): ``Volumes`` (WaitForFirstConsumer claims learn their
node), ``Claims`` (DRA: finalizer, allocation and ``reservedFor`` exactly as the Decision
says, the special claim of extended resources), ``DeviceRecord`` (the record the Bind writes
with ``spec.nodeName``). ``NominatedNode`` (kube-scheduler's NominatedNodeNameForExpectation:
the pod names its node in ``status.nominatedNodeName`` while the slower steps write) is a step
a cycle may add; the default leaves it out, so the default cycle writes what kallot wrote
before the steps existed. Adding a step: a class with ``name``, ``pre_bind``, ``undo`` and
``bound`` (``_: type[PreBindStep] = MyStep``), listed where the Binder is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from kallot.config import device_record
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.bind import claims as dra_claims
from kallot.kube.bind import volumes
from kallot.kube.dra.cache import DraCache, DraPlan
from kallot.kube.state.cache import Cache
from kallot.kube.state.store import PodEntry

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BindRequest:
    uid: str
    namespace: str
    name: str
    node: str
    record: device_record.DeviceRecord
    submitted: float  # monotonic


@dataclass(slots=True)
class BindCycle:
    """One pod's binding cycle: the request, the pod as the cache holds it, and what each
    step did (by step name: what its ``undo`` takes back), like kube-scheduler's CycleState."""

    req: BindRequest
    entry: PodEntry | None  # None: the pod is gone (the cycle only undoes)
    #: what the Bind writes with ``spec.nodeName`` (``DeviceRecord``); None: no record
    record: device_record.DeviceRecord | None = None
    wrote: dict[str, Any] = field(default_factory=dict)


class PreBindStep(Protocol):
    """A step before the Bind. Contracts:

    - ``pre_bind``: write what the pod needs before ``spec.nodeName``; "" when done, else why
      the bind fails (one line). Record in ``cycle.wrote[name]`` what was written, also when
      failing half-way. Never raises for an API answer.
    - ``undo``: take back what this cycle's ``pre_bind`` wrote (and what was reserved for it
      in memory), best effort; called for every step, newest first, when the pod ends
      unbound, also for a step whose ``pre_bind`` never ran.
    - ``bound``: the pod is bound; release only the bookkeeping kept for the undo."""

    name: ClassVar[str]

    async def pre_bind(self, cycle: BindCycle) -> str: ...

    async def undo(self, cycle: BindCycle) -> None: ...

    def bound(self, cycle: BindCycle) -> None: ...


class Volumes:
    """VolumeBinding's PreBind (``kube.bind.volumes.prebind``): a WaitForFirstConsumer claim
    gets ``volume.kubernetes.io/selected-node`` (or its static PV the claim in ``claimRef``).
    Undo takes back those writes while nothing has acted on them (``volumes.unbind``)."""

    name: ClassVar[str] = "Volumes"

    def __init__(self, client: KubeClient, cache: Cache) -> None:
        self.client = client
        self.cache = cache

    async def pre_bind(self, cycle: BindCycle) -> str:
        task = cycle.entry.task if cycle.entry is not None else None
        if task is None or task.k8s is None or not task.k8s.claims:
            return ""
        req = cycle.req
        index = self.cache.volumes
        provision = index.resolve(req.namespace, task.k8s.claims).provision
        if not provision:
            return ""
        info = self.cache.node(req.node)
        labels = info.spec.labels if info is not None else {}
        wrote: list[volumes.Written] = cycle.wrote.setdefault(self.name, [])
        return await volumes.prebind(
            self.client,
            index,
            req.namespace,
            provision,
            node=req.node,
            node_labels=labels,
            wrote=wrote,
        )

    async def undo(self, cycle: BindCycle) -> None:
        wrote: list[volumes.Written] = cycle.wrote.pop(self.name, [])
        if wrote:
            await volumes.unbind(self.client, wrote, node=cycle.req.node)

    def bound(self, cycle: BindCycle) -> None:
        cycle.wrote.pop(self.name, None)


class Claims:
    """DynamicResources' PreBind (``kube.bind.claims.prebind``): the pod's claims allocated
    and reserved exactly as the session's Decision says (``DraCache.reserve`` put them in
    ``DraCache.plans``). Undo is its Unreserve: the pod leaves ``reservedFor``, the
    allocations it wrote are cleared, its special claim deleted, and the in-flight allocations
    given back (``DraCache.drop``)."""

    name: ClassVar[str] = "Claims"

    def __init__(self, client: KubeClient, dra: DraCache) -> None:
        self.client = client
        self.dra = dra

    def _plan(self, cycle: BindCycle) -> DraPlan | None:
        plan = self.dra.plans.get(cycle.req.uid)
        if plan is None or plan.node != cycle.req.node:
            return None  # none, or re-decided since: the newer placement's cycle owns it
        return plan

    async def pre_bind(self, cycle: BindCycle) -> str:
        plan = self._plan(cycle)
        if plan is None:
            return ""
        req = cycle.req
        problem = await dra_claims.prebind(
            self.client, self.dra, plan, namespace=req.namespace, name=req.name, uid=req.uid
        )
        if problem:
            # prebind took back its own writes: give the in-flight allocations back now,
            # before the pod is pending again (the next session must not see them held).
            self.dra.drop(req.uid, allocations=True)
        return problem

    async def undo(self, cycle: BindCycle) -> None:
        plan = self._plan(cycle)
        if plan is None:
            return
        await dra_claims.undo(self.client, plan, cycle.req.uid)
        self.dra.drop(cycle.req.uid, allocations=True)

    def bound(self, cycle: BindCycle) -> None:
        if self._plan(cycle) is not None:
            self.dra.drop(cycle.req.uid, allocations=False)  # in flight until the watch shows it


class DeviceRecord:
    """The device record (``kallot.io/devices``, bind phase and time) rides on the Bind: one
    write sets it with ``spec.nodeName``, so no agent sees a bound pod without its devices.
    Nothing is written before the Bind, so there is nothing to undo."""

    name: ClassVar[str] = "DeviceRecord"

    async def pre_bind(self, cycle: BindCycle) -> str:
        cycle.record = cycle.req.record
        return ""

    async def undo(self, cycle: BindCycle) -> None:
        cycle.record = None

    def bound(self, cycle: BindCycle) -> None:
        del cycle


class NominatedNode:
    """kube-scheduler's NominatedNodeNameForExpectation: before the steps after it write
    (volumes, claims), the pod names the node it is being bound to in
    ``status.nominatedNodeName``, so other schedulers and autoscalers count it there; undo
    puts back the nomination it had. The API server clears it when the pod binds
    (ClearingNominatedNodeNameAfterBinding, on since 1.35). Only for pods with such writes:
    a pod without them binds at once."""

    name: ClassVar[str] = "NominatedNode"

    def __init__(self, client: KubeClient, cache: Cache, dra: DraCache | None) -> None:
        self.client = client
        self.cache = cache
        self.dra = dra

    def _slow(self, cycle: BindCycle) -> bool:
        task = cycle.entry.task if cycle.entry is not None else None
        if self.dra is not None and cycle.req.uid in self.dra.plans:
            return True
        if task is None or task.k8s is None or not task.k8s.claims:
            return False
        return bool(self.cache.volumes.resolve(cycle.req.namespace, task.k8s.claims).provision)

    async def pre_bind(self, cycle: BindCycle) -> str:
        task = cycle.entry.task if cycle.entry is not None else None
        before = task.k8s.nominated_node if task is not None and task.k8s is not None else ""
        if before == cycle.req.node or not self._slow(cycle):
            return ""
        req = cycle.req
        try:
            await self.client.patch_pod_status(
                req.namespace,
                req.name,
                {"metadata": {"uid": req.uid}, "status": {"nominatedNodeName": req.node}},
            )
        except ApiError as exc:
            return f"pod status.nominatedNodeName: {exc.message or exc.reason or exc.status}"
        cycle.wrote[self.name] = before
        return ""

    async def undo(self, cycle: BindCycle) -> None:
        if self.name not in cycle.wrote:
            return
        before = cycle.wrote.pop(self.name)
        req = cycle.req
        try:
            await self.client.patch_pod_status(
                req.namespace,
                req.name,
                {"metadata": {"uid": req.uid}, "status": {"nominatedNodeName": before or None}},
            )
        except ApiError as exc:
            if not exc.not_found:
                logger.warning(
                    "cannot restore nominatedNodeName pod=%s/%s error=%s",
                    req.namespace,
                    req.name,
                    exc,
                )

    def bound(self, cycle: BindCycle) -> None:
        cycle.wrote.pop(self.name, None)


def default_steps(
    client: KubeClient, cache: Cache, dra: DraCache | None
) -> tuple[PreBindStep, ...]:
    """The cycle the scheduler runs: volumes, DRA claims (with DRA), the device record."""
    steps: list[PreBindStep] = [Volumes(client, cache)]
    if dra is not None:
        steps.append(Claims(client, dra))
    steps.append(DeviceRecord())
    return tuple(steps)


_v: type[PreBindStep] = Volumes
_c: type[PreBindStep] = Claims
_d: type[PreBindStep] = DeviceRecord
_n: type[PreBindStep] = NominatedNode
