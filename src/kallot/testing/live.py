"""Helpers for tests and benchmarks of the live scheduler on the real control plane.

Where it sits: test support next to ``kallot.testing.controlplane`` (which runs etcd and
kube-apiserver). This module adds what a kallot test needs on top: Node bodies that publish a
kallot GPU inventory, Pod bodies that ask for GPUs the way docs/pod-api.md says, the scheduler
as a real subprocess (``kallot scheduler``) that can be SIGTERMed or SIGKILLed, condition
waits with a timeout, and the one check every e2e test ends with: the device records on the
pods never give a GPU more than it holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import urllib3

from kallot.config import wire
from kallot.config.device_record import ANNOTATION as DEVICES_ANNOTATION
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.config.inventory import Device, MigDevice, NodeInventory
from kallot.core.resources import GPU_MODELS, MILLI
from kallot.k8sclient import sync as client
from kallot.testing.controlplane import ControlPlane, create_nodes_sync, gpu_node_body

__all__ = [
    "Cluster",
    "SchedulerProcess",
    "Usage",
    "free_port",
    "gpu_usage",
    "inventory_node_body",
    "pod_body",
    "wait_until",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after
    ``timeout`` seconds with ``what`` in the message. The poll is the synchronisation: no
    fixed sleep stands in for "long enough"."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def pending_reason(pod: Mapping[str, Any]) -> str:
    """The message of the pod's ``PodScheduled=False`` condition: why it waits, as the
    scheduler wrote it; "" when it has none (bound, or not reported yet)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message", ""))
    return ""


def inventory_node_body(
    name: str,
    gpus: int = 8,
    *,
    model: str = "H100-80GB",
    mode: str = "mps",
    labels: Mapping[str, str] | None = None,
    cpu_milli: int = 64_000,
    mem_mib: int = 512 * 1024,
    mig: Mapping[int, Sequence[tuple[str, int]]] | None = None,
) -> dict[str, Any]:
    """A Ready Node with ``nvidia.com/gpu`` allocatable and the node agent's inventory
    annotation (docs/node-inventory.md), GPU UUIDs ``GPU-<name>-<i>``. ``mig`` maps a GPU index
    to its existing MIG instances, ``(profile, start)``; those GPUs are in mode ``mig``."""
    body = gpu_node_body(name, gpus, cpu_milli=cpu_milli, mem_mib=mem_mib, labels=labels)
    mem = GPU_MODELS[model].memory_mib
    devices = []
    for i in range(gpus):
        instances = tuple(
            MigDevice(profile=p, start=start, uuid=f"MIG-{name}-{i}-{start}")
            for p, start in (mig or {}).get(i, ())
        )
        devices.append(
            Device(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model=model,
                mem_mib=mem,
                mode="mig" if instances else mode,
                mig=instances,
            )
        )
    inv = NodeInventory(devices=tuple(devices))
    body["metadata"]["annotations"] = {INVENTORY_ANNOTATION: inv.to_json()}
    body["metadata"]["labels"][wire.LABEL_GFD_PRODUCT] = model
    return body


def pod_body(
    name: str,
    *,
    resources: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler: str = "kallot",
    cpu: str = "100m",
    memory: str = "128Mi",
) -> dict[str, Any]:
    """A pod asking for ``resources`` (limits; the API server copies them to requests)."""
    limits = {"cpu": cpu, "memory": memory, **(resources or {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "kallot.io/test:none", "resources": {"limits": limits}}
            ],
        },
    }


@dataclass
class Usage:
    """What the device records on bound pods give each GPU, keyed by (node, uuid)."""

    milli: dict[tuple[str, str], int]
    mem_mib: dict[tuple[str, str], int]
    exclusive: dict[tuple[str, str], list[str]]  # pods holding it exclusively
    holders: dict[tuple[str, str], list[str]]
    records: dict[str, DeviceRecord]  # pod key -> record
    # (node, GPU uuid, profile, start) -> pods holding that MIG instance
    mig: dict[tuple[str, str, str, int], list[str]] = field(default_factory=dict)


def gpu_usage(pods: Iterable[Mapping[str, Any]]) -> Usage:
    """Sum the device records of bound, unfinished pods (plain dicts, as the API returns)."""
    u = Usage({}, {}, {}, {}, {})
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            continue
        text = (meta.get("annotations") or {}).get(DEVICES_ANNOTATION)
        if not text:
            continue
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        record = DeviceRecord.from_json(text)
        u.records[key] = record
        for d in record.devices:
            g = (record.node, d.uuid)
            u.milli[g] = u.milli.get(g, 0) + d.milli
            u.mem_mib[g] = u.mem_mib.get(g, 0) + d.mem_mib
            u.holders.setdefault(g, []).append(key)
            if d.mode == "exclusive":
                u.exclusive.setdefault(g, []).append(key)
            if d.mig is not None:
                u.mig.setdefault((record.node, d.uuid, d.mig.profile, d.mig.start), []).append(key)
    return u


def overcommitted(usage: Usage, gpu_mem_mib: Mapping[tuple[str, str], int]) -> list[str]:
    """Every way the records over-commit a GPU (empty when they never do)."""
    problems = []
    for g, milli in usage.milli.items():
        if milli > MILLI:
            problems.append(f"{g}: {milli} milli-GPU given to {usage.holders[g]}")
        if g in gpu_mem_mib and usage.mem_mib[g] > gpu_mem_mib[g]:
            problems.append(f"{g}: {usage.mem_mib[g]} MiB of {gpu_mem_mib[g]} given")
        if g not in gpu_mem_mib:
            problems.append(f"{g}: not a GPU of that node, given to {usage.holders[g]}")
    for g, holders in usage.exclusive.items():
        if len(usage.holders[g]) > 1:
            problems.append(f"{g}: exclusive for {holders} but shared with {usage.holders[g]}")
    for instance, holders in usage.mig.items():
        if len(holders) > 1:
            problems.append(f"MIG instance {instance} held by {holders}")
    return problems


class SchedulerProcess:
    """``kallot scheduler`` in a subprocess, logging to ``log_path``."""

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        log_path: Path,
        *,
        identity: str = "",
        leader_elect: bool = False,
        lease_name: str = "kallot-scheduler",
        lease_namespace: str = "default",
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_port()  # plain HTTP, for the tests' own reads
        self.secure_port = free_port()  # TLS + delegated auth, as the chart runs it
        self.identity = identity
        self.log_path = log_path
        args = [
            sys.executable,
            "-m",
            "kallot.cli.main",
            "scheduler",
            f"--kubeconfig={os.fspath(kubeconfig)}",
            f"--metrics-address=127.0.0.1:{self.port}",
            f"--secure-address=127.0.0.1:{self.secure_port}",
            "--leader-elect" if leader_elect else "--no-leader-elect",
            f"--lease-name={lease_name}",
            f"--lease-namespace={lease_namespace}",
            *([f"--identity={identity}"] if identity else []),
            *extra,
        ]
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        self.popen = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def get_secure(self, path: str, token: str | None = None) -> tuple[int, str]:
        """GET over TLS from the secure port (its certificate is self-signed: not verified,
        as Prometheus scrapes kube-scheduler), with ``token`` as the bearer token."""
        import ssl

        tls = ssl.create_default_context()
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(f"https://127.0.0.1:{self.secure_port}{path}")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10, context=tls) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def secure_ready(self) -> bool:
        """``/readyz`` on the secure port answers 200 (False while it is not listening)."""
        self.check_alive()
        with contextlib.suppress(OSError):
            return self.get_secure("/readyz")[0] == 200
        return False

    def ready(self) -> bool:
        self.check_alive()
        with contextlib.suppress(OSError):
            return self.get("/readyz")[0] == 200
        return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_until(self.ready, timeout=timeout, what=f"scheduler {self.identity} /readyz")

    def check_alive(self) -> Literal[True]:
        """True while the scheduler runs (a poll reads ``s.check_alive() and done()``); an
        AssertionError with its log's tail once it has exited."""
        if self.popen.poll() is not None:
            raise AssertionError(
                f"scheduler exited with {self.popen.returncode}:\n{self.log_tail()}"
            )
        return True

    def metric(self, name: str) -> dict[str, float]:
        """Samples of one metric family as {label text: value}."""
        status, text = self.get("/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                head, _, value = line.rpartition(" ")
                if head == name or head.startswith(name + "{"):
                    out[head[len(name) :]] = float(value)
        return out

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self._log.close()


RUN_LABEL = "kallot.test/run"


def _json(resp: object) -> Any:
    """The JSON body of a call made with ``_preload_content=False``: the client returns the raw
    urllib3 response then, though its annotations name the model it returns otherwise."""
    assert isinstance(resp, urllib3.BaseHTTPResponse), type(resp)
    return json.loads(resp.data)


class Cluster:
    """One test's slice of the shared control plane."""

    def __init__(self, cp: ControlPlane, api: client.ApiClient, log_dir: Path) -> None:
        self.cp = cp
        self.api = api
        self.v1 = client.CoreV1Api(api)
        self.run = uuid.uuid4().hex[:6]
        self.ns = f"t-{self.run}"
        self.lease = f"kallot-{self.run}"
        self.log_dir = log_dir
        self.schedulers: list[SchedulerProcess] = []
        self.gpu_mem: dict[tuple[str, str], int] = {}
        self.v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=self.ns)))

    # -- objects ---------------------------------------------------------------------------

    def add_nodes(self, bodies: Sequence[Mapping[str, Any]]) -> list[str]:
        for b in bodies:
            b["metadata"].setdefault("labels", {})[RUN_LABEL] = self.run
            inv = json.loads(b["metadata"].get("annotations", {}).get(INVENTORY_ANNOTATION, "{}"))
            for d in inv.get("devices", []):
                if "uuid" in d and "memMiB" in d:  # a test may publish a broken inventory
                    self.gpu_mem[(b["metadata"]["name"], d["uuid"])] = d["memMiB"]
        return create_nodes_sync(self.cp.kubeconfig_path, bodies, concurrency=16)

    def create_pod_group(self, name: str, **spec: Any) -> None:
        """A kallot PodGroup (``kallot.io/v1alpha1``) in the test's namespace; ``spec`` as the
        CRD has it (``minAvailable=2``, ``queue=...``, ``topology={...}``)."""
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "kallot.io",
            "v1alpha1",
            self.ns,
            "podgroups",
            {
                "apiVersion": "kallot.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def create_pods(self, bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        def one(body: Mapping[str, Any]) -> dict[str, Any]:
            pod = client.V1Pod.model_validate(body)  # what the client's validate_call does
            out: dict[str, Any] = _json(
                self.v1.create_namespaced_pod(self.ns, pod, _preload_content=False)
            )
            return out

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, bodies))

    def pods(self) -> list[dict[str, Any]]:
        resp = self.v1.list_namespaced_pod(self.ns, _preload_content=False)
        items: list[dict[str, Any]] = _json(resp)["items"]
        return items

    def pod(self, name: str) -> dict[str, Any]:
        resp = self.v1.read_namespaced_pod(name, self.ns, _preload_content=False)
        out: dict[str, Any] = _json(resp)
        return out

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name}" if name else None
        resp = self.v1.list_namespaced_event(
            self.ns, field_selector=selector, _preload_content=False
        )
        items: list[dict[str, Any]] = _json(resp)["items"]
        return items

    def delete_pod(self, name: str) -> None:
        self.v1.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def delete_node(self, name: str) -> None:
        self.v1.delete_node(name)

    def install_crds(self, crds: Sequence[Mapping[str, Any]]) -> None:
        """Creates CRDs (kept when they exist: they are cluster-wide, shared by the tests of
        one control plane) and waits until the API server serves them."""
        ext = client.ApiextensionsV1Api(self.api)
        for crd in crds:
            try:
                ext.create_custom_resource_definition(
                    client.V1CustomResourceDefinition.model_validate(crd)
                )
            except client.ApiException as exc:
                if exc.status != 409:
                    raise

        def served() -> bool:
            for crd in crds:
                got = ext.read_custom_resource_definition(crd["metadata"]["name"])
                conds = (got.status.conditions if got.status else None) or []
                if not any(c.type == "Established" and c.status == "True" for c in conds):
                    return False
            return True

        wait_until(served, timeout=30, what="the CRDs to be served")

    # -- schedulers ------------------------------------------------------------------------

    def scheduler(self, identity: str = "s", **kwargs: Any) -> SchedulerProcess:
        s = SchedulerProcess(
            self.cp.kubeconfig_path,
            self.log_dir / f"scheduler-{identity}-{len(self.schedulers)}.log",
            identity=identity,
            lease_name=self.lease,
            **kwargs,
        )
        self.schedulers.append(s)
        return s

    # -- the checks every test ends with ---------------------------------------------------

    def settled(self, pods: list[dict[str, Any]] | None = None) -> bool:
        """Every pod is bound, or pending with a PodScheduled=False reason written."""
        for p in pods if pods is not None else self.pods():
            if p["spec"].get("nodeName"):
                continue
            conds = p.get("status", {}).get("conditions") or []
            if not any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds):
                return False
        return True

    def assert_no_overcommit(self, pods: list[dict[str, Any]] | None = None) -> None:
        pods = pods if pods is not None else self.pods()
        usage = gpu_usage(pods)
        problems = overcommitted(usage, self.gpu_mem)
        assert not problems, "\n".join(problems)
        for p in pods:
            node = p["spec"].get("nodeName")
            key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            if node:
                assert key in usage.records, f"{key} bound to {node} without a device record"
                assert usage.records[key].node == node, f"{key}: record names another node"

    def close(self) -> None:
        for s in self.schedulers:
            s.kill()
        self.v1.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        self.v1.delete_collection_node(label_selector=f"{RUN_LABEL}={self.run}")
