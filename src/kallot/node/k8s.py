"""The node agent's only door to the Kubernetes API (the official ``kubernetes`` client, aio).

- ``Publisher``: the node's GFD-named labels and the ``kallot.io/gpu-inventory`` annotation, by
  server-side apply with the field manager ``kallot-agent``, sent only when they changed (a
  label the agent stops publishing is removed by the apply, because the manager owned it);
  ``kallot.io/gpu-memory`` into ``status.capacity`` the same way.
- ``ApiRecordSource``: the device records of the pods bound to this node, for Allocate, and the
  ``kallot.io/bind-phase: allocated`` mark once their devices were handed out.
- ``Events``: Events on the Node (health transitions) and on Pods (refused allocations).

Objects stay plain dicts (the API's JSON) through the generated client's generic request path.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config
from kubernetes.utils.quantity import parse_quantity

from kallot.config import device_record, inventory
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import NodeInventory
from kallot.core.errors import ConfigError, KallotError
from kallot.node import allocate
from kallot.node.allocate import PodRecord

log = logging.getLogger(__name__)

FIELD_MANAGER = "kallot-agent"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
RESOURCE_GPU_MEMORY = "kallot.io/gpu-memory"


class ApiError(KallotError):
    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class NodeClient:
    """Asynchronous JSON requests to one API server."""

    def __init__(self, api: aio_client.ApiClient) -> None:
        self._api = api
        self._api.user_agent = "kallot-agent"
        self.requests = 0  # writes and reads sent (tests check "only on change")

    @staticmethod
    async def connect(kubeconfig: str | os.PathLike[str] | None = None) -> NodeClient:
        """Client for ``kubeconfig`` ($KUBECONFIG, ~/.kube/config, then in-cluster)."""
        configuration = aio_client.Configuration()
        path = os.fspath(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", "")
        default = Path("~/.kube/config").expanduser()
        if not path and default.is_file():
            path = str(default)
        if path:
            try:
                await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=path, client_configuration=configuration
                )
            except Exception as exc:  # the client's errors are tracebacks; one line instead
                line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ConfigError("--kubeconfig", path, f"a usable kubeconfig ({line})") from None
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            raise KallotError(
                "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run inside a cluster "
                "(or run without the API: --no-kube)"
            )
        return NodeClient(aio_client.ApiClient(configuration=configuration))

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self.requests += 1
        try:
            m, url, headers, data, post = await self._api.param_serialize(
                method,
                path,
                query_params=list(query) or None,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            resp: Any = await self._api.call_api(
                m, url, headers, data, post, _request_timeout=timeout
            )
            raw: bytes = await resp.read()
        except aio_client.exceptions.ApiException as exc:
            raise ApiError(method, path, int(exc.status or 0), str(exc.reason)) from exc
        except (OSError, TimeoutError) as exc:
            raise ApiError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
        if not 200 <= resp.status < 300:
            raise ApiError(method, path, resp.status, raw[:300].decode(errors="replace"))
        result: dict[str, Any] = json.loads(raw) if raw else {}
        return result


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
        self.applied = 0

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
    """A pod's device record as Allocate reads it (``error`` set when the record is unreadable)."""
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


class ApiRecordSource:
    """``deviceplugin.RecordSource`` on the API server: pods with ``spec.nodeName`` = this node
    that have not finished."""

    def __init__(self, client: NodeClient, node: str) -> None:
        self.client = client
        self.node = node

    async def pods(self) -> list[PodRecord]:
        answer = await self.client.request(
            "GET",
            "/api/v1/pods",
            query=[("fieldSelector", f"spec.nodeName={self.node}")],
        )
        out = []
        for pod in answer.get("items") or []:
            phase = (pod.get("status") or {}).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                continue
            out.append(pod_record(pod))
        return out

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
