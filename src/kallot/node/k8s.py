"""The node agent's only door to the Kubernetes API (the official ``kubernetes`` client, aio).

- ``Publisher``: the node's GFD-named labels and the ``kallot.io/gpu-inventory`` annotation, by
  server-side apply with the field manager ``kallot-agent``, sent only when they changed (a
  label the agent stops publishing is removed by the apply, because the manager owned it);
  ``kallot.io/gpu-memory`` into ``status.capacity`` the same way; the Node condition
  ``kallot.io/DevicePluginsReady`` (``node.kubelet_checkpoint``) by strategic merge patch, which
  merges conditions by type as the kubelet's own status updates do.
- ``ApiRecordSource``: the device records of the pods bound to this node, for Allocate (a
  node-scoped pod informer: LIST + WATCH with ``spec.nodeName``), and the
  ``kallot.io/bind-phase: allocated`` mark once their devices were handed out.
- ``Events``: Events on the Node (health transitions) and on Pods (refused allocations).

Objects stay plain dicts (the API's JSON) through the generated client's generic request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from kallot.config import device_record, inventory, wire
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import NodeInventory
from kallot.config.record_trust import record_refusal
from kallot.core.errors import ConfigError
from kallot.k8sclient import api as k8s
from kallot.k8sclient.api import APPLY_PATCH, MERGE_PATCH, STRATEGIC_PATCH
from kallot.k8sclient.client import NO_RETRY, JsonClient
from kallot.k8sclient.errors import ApiError
from kallot.k8sclient.quantity import parse_quantity
from kallot.node import allocate
from kallot.node.allocate import PodRecord

log = logging.getLogger(__name__)

FIELD_MANAGER = "kallot-agent"
RESOURCE_GPU_MEMORY = wire.RESOURCE_GPU_MEMORY


class NodeClient(JsonClient):
    """Asynchronous JSON requests to one API server, one try each (the agent's loops retry)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        super().__init__(api, user_agent="kallot-agent", retry=NO_RETRY)

    @staticmethod
    async def connect(kubeconfig: str | os.PathLike[str] | None = None) -> NodeClient:
        """Client for ``kubeconfig`` ($KUBECONFIG, ~/.kube/config, then in-cluster)."""
        configuration = await k8s.load_configuration(
            kubeconfig,
            missing="no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run inside a cluster "
            "(or run without the API: --no-kube)",
        )
        return NodeClient(k8s.api_client(configuration))

    async def watch(
        self, path: str, *, query: Sequence[tuple[str, str]] = (), timeout: float = 360.0
    ) -> AsyncIterator[dict[str, Any]]:
        """A WATCH on ``path`` (``watch=true`` added): one event dict per JSON line, until the
        server ends the watch (its ``timeoutSeconds``) or ``timeout`` passes."""
        self.requests += 1
        resp = await k8s.send(
            self._api,
            "GET",
            path,
            query=[*query, ("watch", "true")],
            content_type=None,
            timeout=timeout,
        )
        async for event in k8s.json_lines(path, resp):
            yield event


def gpu_memory_capacity(inv: NodeInventory) -> str:
    """``kallot.io/gpu-memory`` capacity: the memory of the GPUs in a shared mode plus that of
    the existing MIG instances (a share may run on one), as a quantity."""
    mib = sum(d.mem_mib for d in inv.devices if d.mode in ("mps", "time-slicing") and d.healthy)
    mib += sum(
        allocate.mig_mem_mib(d, m)
        for d in inv.devices
        if d.mode == "mig" and d.healthy
        for m in d.mig
    )
    return f"{mib}Mi"


def _milli(value: object) -> int:
    try:
        return int(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return 0


def pod_milli(pod: Mapping[str, Any]) -> int:
    """The pod's ``kallot.io/gpu-milli`` request as the scheduler sums it: the app containers
    and the sidecars (restartable init containers), or the largest init container if more."""
    spec = pod.get("spec") or {}

    def asked(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            value = (res.get(part) or {}).get(allocate.RESOURCE_MILLI)
            if value is not None:
                return _milli(value)
        return 0

    total = sum(asked(c) for c in spec.get("containers") or [])
    sidecars = 0
    peak = 0
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            sidecars += asked(c)
        else:
            peak = max(peak, asked(c) + sidecars)
    return max(total + sidecars, peak)


class Publisher:
    """Publishes labels + inventory on the Node; skips the request when nothing changed."""

    def __init__(self, client: NodeClient, node: str) -> None:
        self.client = client
        self.node = node
        self._last = ""
        self._last_status = ""
        self._ready: bool | None = None  # the condition's status as last written
        self.applied = 0

    async def plugins_serving(self, ready: bool, message: str) -> None:
        """Write the ``kallot.io/DevicePluginsReady`` condition (the scheduler places no GPU
        pod of the device plugin's resources here while it is False: kube.translate.node)."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": wire.CONDITION_DEVICE_PLUGINS_READY,
            "status": "True" if ready else "False",
            "reason": "KubeletSettled" if ready else "KubeletNotSettled",
            "message": message or "the kubelet has taken in every advertised device",
            "lastHeartbeatTime": now,
        }
        if ready != self._ready:
            condition["lastTransitionTime"] = now
        await self.client.request(
            "PATCH",
            f"/api/v1/nodes/{self.node}/status",
            body={"status": {"conditions": [condition]}},
            content_type=STRATEGIC_PATCH,
        )
        self._ready = ready

    async def publish(self, labels: Mapping[str, str], inv: NodeInventory) -> bool:
        """Apply when the labels or inventory differ from the last apply; True if sent."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": dict(sorted(labels.items())),
                "annotations": {inventory.ANNOTATION: inv.to_json()},
            },
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        sent = False
        if digest != self._last:
            await self.client.request(
                "PATCH",
                f"/api/v1/nodes/{self.node}",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=body,
                content_type=APPLY_PATCH,
            )
            self._last = digest
            self.applied += 1
            sent = True
        status = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node},
            "status": {"capacity": {RESOURCE_GPU_MEMORY: gpu_memory_capacity(inv)}},
        }
        sdigest = json.dumps(status, sort_keys=True)
        if sdigest != self._last_status:
            await self.client.request(
                "PATCH",
                f"/api/v1/nodes/{self.node}/status",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=status,
                content_type=APPLY_PATCH,
            )
            self._last_status = sdigest
        return sent


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """A pod's device record as Allocate reads it (``error`` set when the record is unreadable
    or refused by ``record_refusal``: then the pod has no record and is charged nothing)."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    record: DeviceRecord | None = None
    error = ""
    text = ann.get(device_record.ANNOTATION)
    if text:
        try:
            record = DeviceRecord.from_json(text)
        except ConfigError as exc:
            error = str(exc)
    if record is not None:
        error = record_refusal(pod, record)
        if error:
            record = None
    try:
        bind_time = int(ann.get(device_record.BIND_TIME, "0") or 0)
    except ValueError:
        bind_time = 0
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        record=record,
        allocated=ann.get(device_record.BIND_PHASE) == "allocated",
        bind_time=bind_time,
        error=error,
        milli=pod_milli(pod),
        owner=pod_owner(meta),
    )


def pod_owner(meta: Mapping[str, Any]) -> str:
    """The pod's workload as "Kind/name" from its controller owner reference; a ReplicaSet
    named ``<deployment>-<pod-template-hash>`` is its Deployment's (the Deployment controller's
    naming); "" for a pod without a controller."""
    for ref in meta.get("ownerReferences") or ():
        if not ref.get("controller"):
            continue
        kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
        h = ((meta.get("labels") or {}).get("pod-template-hash")) or ""
        if kind == "ReplicaSet" and h and name.endswith(f"-{h}"):
            return f"Deployment/{name[: -len(h) - 1]}"
        return f"{kind}/{name}"
    return ""


def _live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase", "") not in ("Succeeded", "Failed")


class ApiRecordSource:
    """``deviceplugin.RecordSource`` on the API server: pods with ``spec.nodeName`` = this node
    that have not finished.

    Started (``start``), it is a node-scoped informer: one LIST with the field selector
    ``spec.nodeName=<node>``, then a WATCH from that resourceVersion (bookmarks on, renewed every
    ``watch_s``; a 410 Gone or a broken watch lists again), and ``pods()`` answers from that
    cache without a request. Allocate and GetPreferredAllocation ask ``pods(fresh=True)`` only
    when the cache cannot explain the request (the kubelet admitted a pod the watch has not
    delivered yet). Not started, or while the watch is broken, every ``pods()`` is a LIST.
    """

    def __init__(self, client: NodeClient, node: str, *, watch_s: int = 300) -> None:
        self.client = client
        self.node = node
        self.watch_s = watch_s
        self.lists = 0  # LISTs sent (tests and the API-load benchmark)
        self._cache: dict[str, dict[str, Any]] = {}  # uid -> pod
        self._rv = ""
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    async def until(self, predicate: Callable[[list[PodRecord]], bool]) -> list[PodRecord]:
        """Wait until the informer's pods satisfy ``predicate`` (tests synchronize on this)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._synced and predicate(self._records(self._cache.values()))
            )
        return self._records(self._cache.values())

    @staticmethod
    def _records(items: Iterable[Mapping[str, Any]]) -> list[PodRecord]:
        return [pod_record(p) for p in items if _live(p)]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    @property
    def query(self) -> list[tuple[str, str]]:
        return [("fieldSelector", f"spec.nodeName={self.node}")]

    async def _list(self) -> list[dict[str, Any]]:
        self.lists += 1
        answer = await self.client.request("GET", "/api/v1/pods", query=self.query)
        items: list[dict[str, Any]] = answer.get("items") or []
        self._rv = str((answer.get("metadata") or {}).get("resourceVersion", ""))
        return items

    async def start(self) -> None:
        """List once and keep the cache current with a WATCH until ``stop``."""
        items = await self._list()
        self._cache = {str(p["metadata"]["uid"]): p for p in items}
        self._synced = True
        self._task = asyncio.create_task(self._run(), name="pod-informer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._synced = False

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                if not self._synced:
                    items = await self._list()
                    self._cache = {str(p["metadata"]["uid"]): p for p in items}
                    self._synced = True
                    await self._notify()
                await self._watch_once()
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API may be away: LIST per call meanwhile, retry
                log.warning("pod watch on %s: %s; listing again", self.node, exc)
                self._synced = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _watch_once(self) -> None:
        query = [
            *self.query,
            ("resourceVersion", self._rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_s)),
        ]
        async for event in self.client.watch(
            "/api/v1/pods", query=query, timeout=self.watch_s + 60
        ):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":  # 410 Gone (resourceVersion too old) and the like: list again
                self._synced = False
                return
            meta = obj.get("metadata") or {}
            self._rv = str(meta.get("resourceVersion", self._rv))
            if kind == "BOOKMARK":
                continue
            uid = str(meta.get("uid", ""))
            if kind == "DELETED":
                self._cache.pop(uid, None)
            else:
                self._cache[uid] = obj
            await self._notify()

    def images(self) -> list[str]:
        """The container images of the node's running pods (the informer's cache; [] when not
        started): the agent looks for dcgm-exporter among them."""
        if not self._synced:
            return []
        return [
            str(c.get("image", ""))
            for p in self._cache.values()
            if _live(p)
            for c in (p.get("spec") or {}).get("containers") or []
        ]

    async def pods(self, *, fresh: bool = False) -> list[PodRecord]:
        if self._synced and not fresh:
            return self._records(self._cache.values())
        return self._records(await self._list())

    async def mark_allocated(self, pod: PodRecord) -> None:
        await self.client.request(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            body={"metadata": {"annotations": {device_record.BIND_PHASE: "allocated"}}},
            content_type=MERGE_PATCH,
        )


class Events:
    """Events from the agent (``source.component: kallot-agent``)."""

    def __init__(self, client: NodeClient, node: str) -> None:
        self.client = client
        self.node = node

    async def on_node(self, reason: str, message: str, *, warning: bool) -> None:
        # Events about cluster-scoped objects live in "default" (the API server insists).
        await self._emit(
            "default",
            {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node},
            reason,
            message,
            warning,
        )

    async def on_pod(self, pod: PodRecord, reason: str, message: str, *, warning: bool) -> None:
        await self._emit(
            pod.namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            reason,
            message,
            warning,
        )

    async def _emit(
        self, namespace: str, obj: dict[str, str], reason: str, message: str, warning: bool
    ) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{obj['name']}.", "namespace": namespace},
            "involvedObject": obj,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": FIELD_MANAGER, "host": self.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except ApiError as exc:  # an Event is best effort; never fail the caller for it
            log.warning("event %s not recorded: %s", reason, exc)
