"""Scale-up in the live scheduler: the pods no node holds -> the core's planner -> capacity asked
for (``kube.autoscale.provision``) -> the new nodes used by the pods they were asked for -> clean-up.

Where it sits: the kube shell, a loop of its own next to the Controller (``kallot scheduler``
with ``autoscale.provisioner`` set, docs/autoscaling.md). The controller hands it every
session's input and decision (``observe``, one of ``Controller.session_observers``); the loop
(``once``, every ``interval_s``, leader only) then

1. plans: the pods sessions found unschedulable that are still pending and not yet asked for
   (a gang with all its pending members) go to ``core.provision.Planner`` with the configured
   node shapes; per planned node it creates one placeholder pod (Karpenter) or, under
   ``provisioningRequest``, per gang one ProvisioningRequest. Each pod asked for is nominated
   (``status.nominatedNodeName``) to its ask's name: Karpenter leaves nominated pods alone
   (``IsProvisionable``), so it does not also count kallot's GPUs as integers for them;
2. delivers: a placeholder kube-scheduler bound to a node (a new one: placeholders require
   ``kallot.io/capacity-taken`` absent, which the loop sets on the nodes of a shape that hold
   kallot's pods or were delivered already and removes when they are neither; one that lands on
   such a node anyway, since kube-scheduler does not count kallot's shares, is withdrawn and
   its pods planned again) has done its job; its pods are nominated to that node (the
   core's NominatedNode score sends them there, NominatedReservation holds its CPU for them)
   and the placeholder is deleted, which frees the node for them in kallot's next session;
3. cleans up: an ask whose pods all bound (anywhere) or went away is deleted, and one that no
   node answered within ``timeout_s`` is withdrawn (its pods are planned again).

Pods the planner cannot place on any shape are not planned again for ``RETRY_S``. A restarted
(or newly elected) scheduler adopts the placeholders and ProvisioningRequests it finds from
their ``kallot.io/capacity-pods`` annotation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kallot.config import wire
from kallot.core.decision import Decision
from kallot.core.provision.plan import Plan, PlannedNode, Planner
from kallot.core.provision.shapes import NodeShape
from kallot.core.workload import Job, Task
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.autoscale import provision
from kallot.kube.state.cache import Cache, PodState, SessionInput

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
RETRY_S = 60.0  # a pod no shape can hold is planned again after this long
DELIVERED_HOLD_S = 30.0  # a pod whose node arrived waits this long for a session before a new ask
PR_PATH = f"/apis/{provision.GROUP}/{provision.VERSION}"


@dataclass(slots=True)
class Ask:
    """One placeholder pod or ProvisioningRequest kallot created, and the pods it is for."""

    kind: str  # "Pod" or "ProvisioningRequest"
    namespace: str
    name: str
    tasks: frozenset[str]
    created: float  # monotonic
    uid: str = ""
    templates: tuple[str, ...] = ()  # a ProvisioningRequest's PodTemplates

    @property
    def path(self) -> str:
        if self.kind == "Pod":
            return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        return f"{PR_PATH}/namespaces/{self.namespace}/{provision.PLURAL}/{self.name}"


class ScaleUp:
    """The loop of the module docstring over one scheduler's cache."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        planner: Planner,
        *,
        provisioner: str,
        namespace: str,
        is_leader: Callable[[], bool] = lambda: True,
        interval_s: float = INTERVAL_S,
        timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if provisioner not in ("karpenter", "provisioningRequest"):
            raise ValueError(
                f"autoscale.provisioner: {provisioner!r}, expected karpenter or provisioningRequest"
            )
        self.client = client
        self.cache = cache
        self.planner = planner
        self.shapes: dict[str, NodeShape] = {s.name: s for s in planner.shapes}
        self.provisioner = provisioner
        self.namespace = namespace
        self.is_leader = is_leader
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.wanting: dict[str, Task] = {}  # unschedulable in a session, not yet placed
        self.jobs: dict[str, Job] = {}
        self.asks: dict[str, Ask] = {}  # by namespace/name
        self.covered: dict[str, str] = {}  # task -> the ask's key
        self.hold: dict[str, float] = {}  # task -> not asked for again before this time
        self.delivered: dict[str, float] = {}  # node -> when an ask's placeholder landed there
        self.plans: list[Plan] = []  # every plan acted on (tests, metrics)
        self.adopted = False

    # -- from the controller -----------------------------------------------------------------

    def observe(self, inp: SessionInput, decision: Decision) -> None:
        """A session's unschedulable pods (not faults: a plugin raised on those)."""
        tasks = {t.id: t for t in inp.tasks}
        for u in decision.unschedulable:
            t = tasks.get(u.task_id)
            if t is None or u.diagnosis.fault:
                continue
            self.wanting[t.id] = t
            if t.job and t.job in inp.jobs:
                self.jobs[t.job] = inp.jobs[t.job]

    # -- the loop ------------------------------------------------------------------------------

    def _pending(self, uid: str) -> bool:
        e = self.cache.pod(uid)
        return e is not None and e.state is PodState.PENDING

    async def once(self) -> Plan | None:
        """One round: adopt (first leader round), deliver, clean up, plan; the plan acted on."""
        if not self.adopted:
            await self._adopt()
            self.adopted = True
        for uid in [u for u in self.wanting if not self._pending(u)]:
            del self.wanting[uid]
        await self._settle()
        await self._mark()  # before any new placeholder, so none lands on a taken node
        return await self._ask()

    async def run(self) -> None:
        while True:
            try:
                if self.is_leader():
                    await self.once()
                else:
                    self.adopted = False  # a new term starts from what the API holds
            except Exception as exc:  # the API briefly unreachable: the next round retries
                log.warning("scale-up: %s", exc)
            await asyncio.sleep(self.interval_s)

    # -- asks in flight --------------------------------------------------------------------------

    async def _settle(self) -> None:
        now = self.clock()
        for key, ask in list(self.asks.items()):
            waiting = {t for t in ask.tasks if self._pending(t)}
            if not waiting:
                await self._withdraw(key, "its pods are placed or gone")
                continue
            if ask.kind == "Pod":
                # Read from the API: the cache keeps no pending pod of another scheduler.
                try:
                    pod = await self.client.get(ask.path)
                except ApiError as exc:
                    if exc.not_found:  # deleted by someone else: plan again
                        self._drop(key)
                        continue
                    raise
                node = str((pod.get("spec") or {}).get("nodeName") or "")
                if node and self._taken(node):
                    # kube-scheduler counts nvidia.com/gpu only: it may put a placeholder on a
                    # node kallot already filled with shares. Not capacity: ask again.
                    await self._withdraw(key, f"it landed on {node}, which is in use")
                    continue
                if node:  # the new node is there: it is for these pods now
                    self.delivered[node] = now
                    await self._nominate(waiting, node)
                    for t in waiting:
                        self.hold[t] = now + DELIVERED_HOLD_S
                    log.info(
                        "capacity arrived node=%s placeholder=%s/%s pods=%d",
                        node,
                        ask.namespace,
                        ask.name,
                        len(waiting),
                    )
                    await self._withdraw(key, f"node {node} is there")
                    continue
            else:
                try:
                    pr = await self.client.get(ask.path)
                except ApiError as exc:
                    if exc.not_found:
                        self._drop(key)
                        continue
                    raise
                state = provision.state(pr)
                if state == "Provisioned":
                    for t in waiting:  # the autoscaler added the nodes: sessions place the gang
                        self.hold[t] = now + DELIVERED_HOLD_S
                    continue
                if state in ("Failed", "CapacityRevoked", "BookingExpired"):
                    await self._withdraw(key, f"ProvisioningRequest {state}")
                    continue
            if now - ask.created > self.timeout_s:
                await self._withdraw(key, f"no capacity within {self.timeout_s:g}s")

    def _drop(self, key: str) -> None:
        ask = self.asks.pop(key)
        for t in ask.tasks:
            if self.covered.get(t) == key:
                del self.covered[t]

    async def _withdraw(self, key: str, why: str) -> None:
        ask = self.asks[key]
        log.info("withdraw %s %s/%s: %s", ask.kind, ask.namespace, ask.name, why)
        paths = [ask.path] + [
            f"/api/v1/namespaces/{ask.namespace}/podtemplates/{t}" for t in ask.templates
        ]
        for path in paths:
            try:
                await self.client.delete(path)
            except ApiError as exc:
                if not exc.not_found:
                    raise
        self._drop(key)

    async def _nominate(self, tasks: Iterable[str], node: str) -> None:
        for uid in tasks:
            e = self.cache.pod(uid)
            if e is None:
                continue
            body = {"metadata": {"uid": uid}, "status": {"nominatedNodeName": node}}
            try:
                await self.client.patch_pod_status(e.namespace, e.name, body)
            except ApiError as exc:  # gone, or replaced: nothing to nominate
                log.info("cannot nominate pod=%s node=%s error=%s", e.key, node, exc)

    # -- new asks ---------------------------------------------------------------------------

    def _candidates(self) -> tuple[list[Task], dict[str, Job]]:
        now = self.clock()
        free = [
            t
            for uid, t in self.wanting.items()
            if uid not in self.covered and self.hold.get(uid, 0.0) <= now and self._pending(uid)
        ]
        for uid in [u for u, until in self.hold.items() if until <= now]:
            del self.hold[uid]
        jobs = {t.job: self.jobs[t.job] for t in free if t.job and t.job in self.jobs}
        # A gang goes to the planner with every pending member, or not at all.
        members: dict[str, int] = {}
        for t in free:
            if t.job:
                members[t.job] = members.get(t.job, 0) + 1
        out = [
            t
            for t in free
            if not t.job or (t.job in jobs and members[t.job] >= jobs[t.job].min_available)
        ]
        return out, jobs

    async def _ask(self) -> Plan | None:
        tasks, jobs = self._candidates()
        if not tasks:
            return None
        plan = await asyncio.to_thread(self.planner.plan, tasks, jobs)
        now = self.clock()
        for uid in plan.unplaceable:
            self.hold[uid] = now + RETRY_S
        if not plan.nodes:
            return plan
        log.info(
            "scale-up plan nodes=%s pods=%d unplaceable=%d cost=%g exact=%s sessions=%d",
            plan.counts(),
            sum(len(n.tasks) for n in plan.nodes),
            len(plan.unplaceable),
            plan.cost,
            plan.exact,
            plan.sessions,
        )
        self.plans.append(plan)
        gang_of = {t.id: t.job for t in tasks if t.job}
        by_gang: dict[str, list[PlannedNode]] = {}
        rest: list[PlannedNode] = []
        for n in plan.nodes:
            g = next((gang_of[t] for t in n.tasks if t in gang_of), "")
            if self.provisioner == "provisioningRequest" and g:
                by_gang.setdefault(g, []).append(n)
            else:
                rest.append(n)
        for gang, nodes in sorted(by_gang.items()):
            await self._request(gang, nodes)
        for n in rest:
            body = provision.placeholder(self.namespace, n, self.shapes[n.shape])
            made = await self.client.create(f"/api/v1/namespaces/{self.namespace}/pods", body)
            meta = made.get("metadata") or {}
            ask = Ask(
                "Pod",
                self.namespace,
                str(meta["name"]),
                frozenset(n.tasks),
                now,
                uid=str(meta.get("uid", "")),
            )
            self._record(ask)
            # Karpenter skips nominated pods: it must not provision for them by integer counts.
            await self._nominate(ask.tasks, ask.name)
        return plan

    def _taken(self, node: str) -> bool:
        """Whether ``node`` holds kallot's pods or was handed to an ask already."""
        if node in self.delivered:
            return True
        return any(
            e.kallot and e.node == node and e.state in (PodState.ASSUMED, PodState.BOUND)
            for e in list(self.cache.pods())
        )

    def _taken_nodes(self) -> set[str]:
        """The nodes a placeholder must not land on: those carrying some shape's labels that
        hold kallot's pods or were handed to an ask in the last ``timeout_s`` (an empty one is
        fine)."""
        now = self.clock()
        for node in [n for n, t in self.delivered.items() if now - t > self.timeout_s]:
            del self.delivered[node]
        taken = set(self.delivered)
        for e in list(self.cache.pods()):
            if e.kallot and e.node and e.state in (PodState.ASSUMED, PodState.BOUND):
                taken.add(e.node)
        out: set[str] = set()
        for name in taken:
            info = self.cache.node(name)
            if info is None:
                continue
            labels = info.spec.labels
            if any(
                all(labels.get(k) == v for k, v in s.labels.items()) for s in self.shapes.values()
            ):
                out.add(name)
        return out

    async def _mark(self) -> None:
        """``kallot.io/capacity-taken`` on exactly the taken nodes (``_taken_nodes``): set where
        it is missing, removed where a node is no longer taken. Recomputed from the cache every
        round, so a new leader repairs what an earlier term left."""
        taken = self._taken_nodes()
        key = wire.LABEL_CAPACITY_TAKEN
        for name in self.cache.node_names():
            info = self.cache.node(name)
            if info is None:
                continue
            has = key in info.spec.labels
            if has == (name in taken):
                continue
            value = "true" if name in taken else None  # None: merge patch removes the label
            try:
                await self.client.patch(
                    f"/api/v1/nodes/{name}", {"metadata": {"labels": {key: value}}}
                )
            except ApiError as exc:
                if not exc.not_found:  # a node deleted meanwhile needs no label
                    raise
            log.info("node=%s %s %s", name, "marked" if value else "unmarked", key)

    async def _request(self, gang: str, nodes: list[PlannedNode]) -> None:
        """A gang's ProvisioningRequest, in the gang's namespace, and its pods pointed at it."""
        uids = [t for n in nodes for t in n.tasks]
        first = self.cache.pod(uids[0])
        if first is None:
            return
        ns = first.namespace
        templates, pr = provision.provisioning_request(ns, gang, nodes, self.shapes)
        for t in templates:
            await _create_or_keep(self.client, f"/api/v1/namespaces/{ns}/podtemplates", t)
        await _create_or_keep(self.client, f"{PR_PATH}/namespaces/{ns}/{provision.PLURAL}", pr)
        ask = Ask(
            "ProvisioningRequest",
            ns,
            str(pr["metadata"]["name"]),
            frozenset(uids),
            self.clock(),
            templates=tuple(str(t["metadata"]["name"]) for t in templates),
        )
        self._record(ask)
        consume = provision.consume_annotations(pr)
        for uid in uids:
            e = self.cache.pod(uid)
            if e is None:
                continue
            try:
                await self.client.patch(
                    f"/api/v1/namespaces/{e.namespace}/pods/{e.name}",
                    {"metadata": {"annotations": consume}},
                )
            except ApiError as exc:
                log.info("cannot point pod=%s at %s: %s", e.key, ask.name, exc)

    def _record(self, ask: Ask) -> None:
        key = f"{ask.namespace}/{ask.name}"
        self.asks[key] = ask
        for t in ask.tasks:
            self.covered[t] = key
        log.info("asked %s %s for pods=%d", ask.kind, key, len(ask.tasks))

    # -- adoption ---------------------------------------------------------------------------

    async def _adopt(self) -> None:
        """The asks a previous term left: placeholders and ProvisioningRequests kallot made."""
        query = [("labelSelector", provision.PLACEHOLDER_LABEL)]
        pods, _ = await self.client.list_all(
            f"/api/v1/namespaces/{self.namespace}/pods", query=query
        )
        found: list[tuple[str, Mapping[str, object]]] = [("Pod", p) for p in pods]
        if self.provisioner == "provisioningRequest":
            try:
                prs, _ = await self.client.list_all(f"{PR_PATH}/{provision.PLURAL}", query=query)
            except ApiError as exc:
                if not exc.not_found:  # the CRD is not installed: nothing to adopt
                    raise
                prs = []
            found += [("ProvisioningRequest", p) for p in prs]
        now = self.clock()
        for kind, obj in found:
            meta = obj.get("metadata")
            if not isinstance(meta, Mapping):
                continue
            ann = meta.get("annotations") or {}
            assert isinstance(ann, Mapping)
            tasks = frozenset(
                t for t in str(ann.get(provision.PLACEHOLDER_PODS, "")).split(",") if t
            )
            # A request's PodTemplates go with it when it is withdrawn: named by its podSets.
            spec = obj.get("spec")
            sets = spec.get("podSets") if isinstance(spec, Mapping) else None
            templates = tuple(
                str(ref["name"])
                for ps in (sets if isinstance(sets, list) else [])
                if isinstance(ps, Mapping)
                and isinstance(ref := ps.get("podTemplateRef"), Mapping)
                and ref.get("name")
            )
            ask = Ask(
                kind,
                str(meta.get("namespace", "")),
                str(meta.get("name", "")),
                tasks,
                now,
                uid=str(meta.get("uid", "")),
                templates=templates if kind == "ProvisioningRequest" else (),
            )
            key = f"{ask.namespace}/{ask.name}"
            if key not in self.asks:
                self.asks[key] = ask
                for t in tasks:
                    self.covered[t] = key
        if found:
            log.info("adopted asks=%d", len(found))


async def _create_or_keep(client: KubeClient, path: str, body: Mapping[str, Any]) -> None:
    """Create ``body``; one already there (a retried round, the same name) is kept."""
    try:
        await client.create(path, body)
    except ApiError as exc:
        if exc.status != 409:
            raise
