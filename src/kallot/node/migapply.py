"""Live MIG re-layout on the node (issue 21): apply the layout the scheduler planned.

Where it sits: a task of the node agent (``agent.Agent`` with ``AgentConfig.mig_reconfigure``),
in device-plugin mode. It watches its own Node for ``kallot.io/mig-plan`` (``config.mig_plan``:
the target layout of each GPU, written by ``kube.schedule.migplan``) and, for a generation it has not
answered yet:

1. reads each GPU's instances back from the backend (NVML, or the fake backend), never from a
   memory of its own, so a restarted agent continues a half-applied plan where it stopped;
2. computes the steps (``core.mig.layout_steps``: instances to destroy, then to create) and
   refuses the whole plan when the target is not a valid layout of the GPU model
   (``core.mig.valid_layout``) or an instance to destroy is in use: a pod's device record names
   it, the kubelet assigned it (pod-resources API), or a process runs on it (NVML);
3. destroys, then creates (``MigBackend``: ``fake.FakeBackend`` or ``nvml_mig.NvmlMig``), one
   call at a time in a worker thread;
4. advertises the new layout (``advertise``: the agent re-discovers, updates ListAndWatch,
   serves and registers a new ``nvidia.com/mig-<profile>`` resource, and publishes the
   inventory the scheduler reads), and only then
5. writes ``kallot.io/mig-plan-status`` (``Applied``, ``Refused`` or ``Failed`` with the
   generation) and Events on the Node and on the pods the plan names.

The scheduler binds the waiting pod once the published inventory shows the planned instance,
so a pod is never bound against a layout the node has not advertised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

from kallot.config import mig_plan
from kallot.config.inventory import NodeInventory
from kallot.config.mig_plan import MigPlan, MigPlanStatus
from kallot.core import mig as core_mig
from kallot.core.errors import ConfigError, KallotError
from kallot.core.resources import canonical_model
from kallot.k8sclient.api import MERGE_PATCH
from kallot.node import allocate
from kallot.node.allocate import PodRecord
from kallot.node.deviceplugin import RecordSource
from kallot.node.discovery import RawGpu, RawNode, mig_profile
from kallot.node.k8s import NodeClient
from kallot.node.podresources import assignments_of, list_pod_resources

log = logging.getLogger(__name__)

FIELD_MANAGER = "kallot-agent-mig"  # not the publisher's: its apply would drop our annotation


class MigBackend(Protocol):
    """What the re-layout needs from a GPU backend (calls block: run in a worker thread)."""

    def raw(self) -> RawNode: ...

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str: ...

    def destroy_mig(self, gpu_index: int, start: int) -> None: ...


class NodeSource(Protocol):
    """The agent's own Node: read, watched, and the status annotation written."""

    async def get(self) -> dict[str, Any]: ...

    def watch(self, resource_version: str) -> AsyncIterator[dict[str, Any]]: ...

    async def write_status(self, status: MigPlanStatus) -> None: ...


class ApiNodeSource:
    """``NodeSource`` on the API server (``node.k8s.NodeClient``): GET and a WATCH with the
    field selector ``metadata.name=<node>``; the status by a merge patch of one annotation."""

    def __init__(self, client: NodeClient, node: str, *, watch_s: int = 300) -> None:
        self.client = client
        self.node = node
        self.watch_s = watch_s

    async def get(self) -> dict[str, Any]:
        return await self.client.request("GET", f"/api/v1/nodes/{self.node}")

    async def watch(self, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        query = [
            ("fieldSelector", f"metadata.name={self.node}"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(self.watch_s)),
        ]
        async for event in self.client.watch("/api/v1/nodes", query=query):
            if event.get("type") == "ERROR":
                return  # 410 Gone and the like: the caller reads the Node again
            if event.get("type") in ("ADDED", "MODIFIED"):
                yield event.get("object") or {}

    async def write_status(self, status: MigPlanStatus) -> None:
        await self.client.request(
            "PATCH",
            f"/api/v1/nodes/{self.node}",
            query=[("fieldManager", FIELD_MANAGER)],
            body={"metadata": {"annotations": {mig_plan.STATUS_ANNOTATION: status.to_json()}}},
            content_type=MERGE_PATCH,
        )


class EventSink(Protocol):
    async def on_node(self, reason: str, message: str, *, warning: bool) -> None: ...

    async def on_pod(self, pod: PodRecord, reason: str, message: str, *, warning: bool) -> None: ...


def mark_reconfigurable(inv: NodeInventory, gpus: Collection[int] | None = None) -> NodeInventory:
    """``inv`` with ``migReconfigurable`` set on its MIG GPUs (those in ``gpus`` if given): the
    scheduler may plan re-layouts of them."""
    return inv.model_copy(
        update={
            "devices": tuple(
                d.model_copy(update={"mig_reconfigurable": True})
                if d.mode == "mig" and (gpus is None or d.index in gpus)
                else d
                for d in inv.devices
            )
        }
    )


def _annotations(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("annotations") or {}


def plan_of(node: Mapping[str, Any]) -> MigPlan | None:
    """The Node's plan; None without one. Raises ConfigError for an unreadable one."""
    text = _annotations(node).get(mig_plan.ANNOTATION)
    return MigPlan.from_json(text) if text else None


def status_of(node: Mapping[str, Any]) -> MigPlanStatus | None:
    text = _annotations(node).get(mig_plan.STATUS_ANNOTATION)
    if not text:
        return None
    try:
        return MigPlanStatus.from_json(text)
    except ConfigError:
        return None  # ours, but unreadable: answer the plan again


def _layout(gpu: RawGpu) -> list[tuple[str, int, str]]:
    return [(mig_profile(m.name), m.start, m.uuid) for m in gpu.mig]


class Refused(KallotError):
    """The plan would break a rule (a busy instance, an invalid layout): nothing was changed."""


class MigReconfigurer:
    """Applies ``kallot.io/mig-plan`` on this node (module docstring)."""

    def __init__(
        self,
        node: str,
        backend: MigBackend,
        records: RecordSource,
        source: NodeSource,
        *,
        advertise: Callable[[], Awaitable[None]],
        events: EventSink | None = None,
        pod_resources_socket: Path | None = None,
        gpus: Collection[int] | None = None,
        busy_uuids: Callable[[], Collection[str]] = lambda: (),
        on_status: Callable[[MigPlanStatus], None] = lambda status: None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.records = records
        self.source = source
        self.advertise = advertise
        self.events = events
        self.pod_resources_socket = pod_resources_socket
        self.gpus = gpus  # indices this agent may change (None: all MIG GPUs)
        self.busy_uuids = busy_uuids  # MIG UUIDs processes run on (NVML)
        self.on_status = on_status  # each answer (the agent's metric)
        self.answered = 0  # the last generation answered (read back from the Node)
        self.outcomes: list[MigPlanStatus] = []  # what this instance wrote (logs and tests)
        self._lock = asyncio.Lock()

    # -- one plan -----------------------------------------------------------------------------

    async def observe(self, node: Mapping[str, Any]) -> MigPlanStatus | None:
        """Answer the Node's plan if it is new; the status written, or None (nothing to do)."""
        async with self._lock:
            status = status_of(node)
            if status is not None:
                self.answered = max(self.answered, status.generation)
            try:
                plan = plan_of(node)
            except ConfigError as exc:
                log.warning("unreadable MIG plan on node %s: %s", self.node, exc)
                return None
            if plan is None or plan.generation <= self.answered:
                return None
            result = await self._answer(plan)
            self.answered = plan.generation
            return result

    async def _answer(self, plan: MigPlan) -> MigPlanStatus:
        try:
            done = await self.apply(plan)
            status = MigPlanStatus(generation=plan.generation, state="Applied", message=done)
        except Refused as exc:
            status = MigPlanStatus(generation=plan.generation, state="Refused", message=str(exc))
        except (KallotError, ConfigError) as exc:
            status = MigPlanStatus(generation=plan.generation, state="Failed", message=str(exc))
        # The status only after the new layout is advertised and published (apply did that).
        await self.source.write_status(status)
        self.outcomes.append(status)
        self.on_status(status)
        reason = {
            "Applied": "MigReconfigured",
            "Refused": "MigReconfigurationRefused",
            "Failed": "MigReconfigurationFailed",
        }[status.state]
        text = f"MIG plan {plan.generation}: {status.state.lower()}: {status.message}"
        warning = status.state != "Applied"
        (log.warning if warning else log.info)("%s", text)
        if self.events is not None:
            await self.events.on_node(reason, text, warning=warning)
            for p in plan.pods:
                pod = PodRecord(namespace=p.namespace, name=p.name, uid=p.uid, record=None)
                await self.events.on_pod(pod, reason, text, warning=warning)
        return status

    async def apply(self, plan: MigPlan) -> str:
        """Bring every GPU of ``plan`` to its target layout; a summary of what changed.
        Raises ``Refused`` (nothing changed) or ``KallotError`` (NVML failed midway: the next
        plan, or this one answered again after a restart, continues from what NVML reports)."""
        raw = await asyncio.to_thread(self.backend.raw)
        by_uuid = {g.uuid: g for g in raw.gpus}
        steps: list[
            tuple[RawGpu, tuple[core_mig.Instance, ...], tuple[core_mig.Instance, ...]]
        ] = []
        for target in plan.gpus:
            gpu = by_uuid.get(target.uuid)
            if gpu is None:
                raise Refused(f"no GPU {target.uuid} on node {self.node}")
            if not gpu.mig_enabled:
                raise Refused(f"GPU {gpu.index} ({gpu.uuid}) is not in MIG mode")
            if self.gpus is not None and gpu.index not in self.gpus:
                raise Refused(f"GPU {gpu.index} is not served by the device plugin")
            model = canonical_model(gpu.name)
            broken = core_mig.valid_layout(model, target.instances())
            if broken:
                raise Refused(f"GPU {gpu.index} ({model}): planned layout is not valid: {broken}")
            current = _layout(gpu)
            destroy, create = core_mig.layout_steps(
                [(n, s) for n, s, _ in current], target.instances()
            )
            steps.append((gpu, destroy, create))
        busy = await self._busy()
        for gpu, destroy, _ in steps:
            held = [
                f"{n}@{s} ({uuid}: {busy[uuid]})"
                for n, s, uuid in _layout(gpu)
                if (n, s) in destroy and uuid in busy
            ]
            if held:
                raise Refused(f"GPU {gpu.index}: instances in use: {', '.join(held)}")
        changed: list[str] = []
        for gpu, destroy, create in steps:
            for name, start in destroy:
                await asyncio.to_thread(self.backend.destroy_mig, gpu.index, start)
                changed.append(f"GPU {gpu.index}: destroyed {name}@{start}")
            for name, start in create:
                await asyncio.to_thread(self.backend.create_mig, gpu.index, name, start)
                changed.append(f"GPU {gpu.index}: created {name}@{start}")
        await self.advertise()
        return "; ".join(changed) or "layout already as planned"

    async def _busy(self) -> dict[str, str]:
        """MIG instance UUID -> who holds it: a device record, the kubelet, a process."""
        out: dict[str, str] = {}
        raw = await asyncio.to_thread(self.backend.raw)
        index = {(g.uuid, mig_profile(m.name), m.start): m.uuid for g in raw.gpus for m in g.mig}
        for pod in await self.records.pods(fresh=True):
            if pod.record is None or pod.record.node != self.node:
                continue
            for d in pod.record.assignments():
                if d.mig is not None:
                    uuid = index.get((d.uuid, d.mig.profile, d.mig.start))
                    if uuid:
                        out[uuid] = f"device record of pod {pod.key}"
        sock = self.pod_resources_socket
        if sock is not None and sock.is_socket():
            try:
                assigned = assignments_of(await list_pod_resources(sock))
            except Exception as exc:  # the kubelet's view is unknown: refuse rather than guess
                raise Refused(f"pod-resources API {sock} did not answer ({exc})") from None
            for (ns, pod_name), resources in assigned.items():
                for ids in resources.values():
                    for i in ids:
                        out.setdefault(
                            allocate.physical(i), f"assigned by the kubelet to {ns}/{pod_name}"
                        )
        for uuid in await asyncio.to_thread(self.busy_uuids):
            out.setdefault(uuid, "a process runs on it")
        return out

    # -- the watch ----------------------------------------------------------------------------

    async def run(self, *, retry_s: float = 1.0) -> None:
        """Read the Node, answer its plan, watch for the next; until cancelled."""
        backoff = retry_s
        while True:
            try:
                node = await self.source.get()
                await self.observe(node)
                rv = str((node.get("metadata") or {}).get("resourceVersion", ""))
                async for obj in self.source.watch(rv):
                    await self.observe(obj)
                backoff = retry_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API may be away; read the Node again
                log.warning("MIG plan watch on node %s: %s", self.node, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
