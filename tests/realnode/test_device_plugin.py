"""The device-plugin path on a real node: ``kallot agent run`` (fake backend, a real process)
registers its resources with the real kubelet, ``kallot scheduler`` places GPU pods, the kubelet
calls the agent's Allocate, and containerd starts the containers with the CDI devices the agent's
own spec defines (node.cdi). Each container's environment and device nodes are exactly what its
pod's device record says.

What the kubelet stand-in (kallot.testing.kubelet, tests/node/test_deviceplugin.py) still covers:
Allocate's refusals, GetPreferredAllocation, ListAndWatch health updates and re-registration
after a kubelet restart, on cue.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch

from kallot.config import wire
from kallot.config.device_record import ANNOTATION as DEVICES_ANNOTATION
from kallot.config.device_record import BIND_TIME, DeviceRecord
from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.config.inventory import NodeInventory
from kallot.k8sclient import sync as client
from kallot.node import cdi
from kallot.testing.controlplane import ControlPlane
from kallot.testing.gpupods import expected_view as _expected
from kallot.testing.gpupods import gpu_pod as _gpu_pod
from kallot.testing.gpupods import run_gpu_pod
from kallot.testing.live import SchedulerProcess, free_port
from kallot.testing.node import Node

pytestmark = [pytest.mark.node, pytest.mark.controlplane]

INVENTORY = Path(__file__).parent / "data" / "gpu-node.yaml"
# The kubelet's log lines once each plugin's ListAndWatch delivered its healthy devices: what a
# restart waits for (the Node's allocatable still shows the old counts meanwhile, and a GPU pod
# admitted in the window fails for good with UnexpectedAdmissionError).
LISTED = [
    f'Processed device updates for resource" resourceName="{r}" totalCount={n} healthyCount={n}'
    for r, n in [
        ("nvidia.com/gpu", 3),
        ("kallot.io/gpu-milli", 1855),
        ("nvidia.com/mig-1g.10gb", 1),
        ("nvidia.com/mig-2g.20gb", 1),
        ("nvidia.com/mig-3g.40gb", 1),
    ]
]


class AgentProcess:
    """``kallot agent run`` against a real node: the kubelet's directories, the node's CDI
    directory, stand-in device nodes under the node's directory."""

    def __init__(self, node: Node, kubeconfig: Path, *extra: str) -> None:
        self.dev_root = node.dir / "dev"
        self.log = node.dir / "agent.log"
        args = [
            sys.executable,
            "-m",
            "kallot.cli.main",
            "agent",
            "run",
            f"--node-name={node.name}",
            f"--inventory-file={INVENTORY}",
            f"--kubeconfig={kubeconfig}",
            f"--device-plugin-dir={node.device_plugin_dir}",
            f"--pod-resources-socket={node.pod_resources_socket}",
            f"--cdi-dir={node.cdi_dir}",
            f"--dev-root={self.dev_root}",
            f"--metrics-address=127.0.0.1:{free_port()}",
            "--refresh-seconds=1",
            *extra,
        ]
        with self.log.open("ab") as f:
            self.popen = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=os.environ)

    def check_alive(self) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(f"agent exited {self.popen.returncode}:\n{self.log.read_text()}")
        return True

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class GpuNode:
    """The real node, the agent serving its fake GPUs, kallot's scheduler, a client."""

    def __init__(self, plane: ControlPlane, node: Node, v1: Any) -> None:
        self.plane, self.node, self.v1 = plane, node, v1
        self.agent = AgentProcess(node, plane.kubeconfig_path)

    def listed(self) -> list[int]:
        return [self.node.kubelet_log_count(line) for line in LISTED]

    def wait_listed(self, before: list[int]) -> None:
        """Until every plugin listed its healthy devices to the kubelet again."""
        self.node.wait_for(
            lambda: all(a > b for a, b in zip(self.listed(), before, strict=True)),
            60,
            "the agent's plugins registered again, their devices healthy",
        )

    def restart_agent(self, *extra: str) -> None:
        before = self.listed()
        self.agent.stop()
        self.agent = AgentProcess(self.node, self.plane.kubeconfig_path, *extra)
        self.wait_listed(before)

    def delete_pods(self) -> None:
        # Graceful (1 s, not 0 = forced): the API object goes only once the kubelet stopped the
        # containers, so the kubelet's device checkpoint no longer holds their GPUs when the
        # next test restarts it.
        for p in self.v1.list_namespaced_pod("default").items:
            self.v1.delete_namespaced_pod(p.metadata.name, "default", grace_period_seconds=1)
        self.node.wait_for(
            lambda: not self.v1.list_namespaced_pod("default").items, 60, "the pods gone"
        )


@pytest.fixture(scope="module")
def gpu_node(node_plane: ControlPlane, real_node: Node) -> Iterator[GpuNode]:
    sched = SchedulerProcess(
        node_plane.kubeconfig_path, real_node.dir / "scheduler.log", identity="realnode"
    )
    with node_plane.api_client() as api:
        g = GpuNode(node_plane, real_node, client.CoreV1Api(api))
        try:
            yield g
        finally:
            g.delete_pods()
            sched.terminate()
            g.agent.stop()


def _inventory(g: GpuNode) -> NodeInventory:
    inv: NodeInventory = g.node.wait_for(
        lambda: (
            (a := g.v1.read_node(g.node.name).metadata.annotations or {}).get(INVENTORY_ANNOTATION)
            and NodeInventory.from_json(a[INVENTORY_ANNOTATION])
        ),
        30,
        "the agent's inventory on the Node",
    )
    return inv


def _allocatable(v1: Any, node: str) -> dict[str, str]:
    return dict(v1.read_node(node).status.allocatable or {})


def _registered(g: GpuNode) -> dict[str, str]:
    """The kubelet registered the agent's plugins: its Node shows their resources."""
    alloc: dict[str, str] = g.node.wait_for(
        lambda: (
            (a := _allocatable(g.v1, g.node.name)).get("nvidia.com/gpu") == "3"
            and a.get("nvidia.com/mig-1g.10gb") == "1"
            and a
        ),
        60,
        "the agent's resources in the Node's allocatable",
    )
    return alloc


def test_gpu_pods_placed_by_kallot_run_with_exactly_their_devices(gpu_node: GpuNode) -> None:
    g = gpu_node
    node, v1 = g.node, g.v1
    alloc = _registered(g)
    assert alloc["kallot.io/gpu-milli"] == str(1000 + 428 + 285 + 142)  # GPU 3 + the 3 MIGs
    inv = node.wait_for(
        lambda: (
            (a := v1.read_node(node.name).metadata.annotations or {}).get(INVENTORY_ANNOTATION)
            and NodeInventory.from_json(a[INVENTORY_ANNOTATION])
        ),
        30,
        "the agent's inventory on the Node",
    )
    spec = json.loads(cdi.device_plugin_spec_path(node.cdi_dir).read_text())
    assert spec["kind"] == cdi.DEVICE_PLUGIN_KIND

    seen: dict[str, set[str]] = {}
    for name, resources in [
        ("whole", {"nvidia.com/gpu": "1"}),
        ("second", {"nvidia.com/gpu": "1"}),
        ("mig", {"nvidia.com/mig-1g.10gb": "1"}),
        ("share", {"kallot.io/gpu-milli": "300", "kallot.io/gpu-memory": "20Gi"}),
        ("mps", {"kallot.io/gpu-milli": "250", "kallot.io/gpu-memory": "10Gi"}),
    ]:
        body = _gpu_pod(name, resources)
        if name == "mps":  # only GPU 3 is in MPS mode: the share's MPS limits
            body["metadata"]["annotations"]["kallot.io/sharing"] = "mps"
        record, shown = _run(node, v1, body)
        assert shown == _expected(record, inv), (name, record)
        seen[name] = shown
    # The second whole-GPU pod never sees the first one's GPU.
    gpus = {
        n: {x for x in s if x.startswith("dev=/dev/nvidia") and x[15:].isdigit()}
        for n, s in seen.items()
    }
    assert gpus["whole"].isdisjoint(gpus["second"])
    v1.delete_namespaced_pod("whole", "default", grace_period_seconds=1)
    v1.delete_namespaced_pod("second", "default", grace_period_seconds=1)
    # Two GPUs once both are free again.
    node.wait_for(
        lambda: (
            not {"whole", "second"}
            & {p.metadata.name for p in v1.list_namespaced_pod("default").items}
        ),
        60,
        "the whole-GPU pods gone",
    )
    record, shown = _run(node, v1, _gpu_pod("two", {"nvidia.com/gpu": "2"}))
    assert len(record.devices) == 2
    assert shown == _expected(record, inv)


def test_after_an_agent_restart_gpu_pods_still_run(gpu_node: GpuNode) -> None:
    g = gpu_node
    g.delete_pods()
    g.restart_agent()  # waits until every plugin listed its healthy devices again
    record, shown = _run(g.node, g.v1, _gpu_pod("after-agent", {"nvidia.com/mig-1g.10gb": "1"}))
    assert shown == _expected(record, _inventory(g))


class _PluginsCondition:
    """Every status of the Node's ``kallot.io/DevicePluginsReady`` condition, from a WATCH (a
    poll could miss a short False), with its lastTransitionTime."""

    def __init__(self, g: GpuNode) -> None:
        self.seen: list[tuple[str, dt.datetime]] = []
        self._g = g
        self._stop = threading.Event()
        node = g.v1.read_node(g.node.name)
        self._rv = node.metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
        while not self._stop.is_set():
            for event in w.stream(  # type: ignore[no-untyped-call]
                self._g.v1.list_node,
                field_selector=f"metadata.name={self._g.node.name}",
                resource_version=self._rv,
                timeout_seconds=5,
            ):
                node = event["object"]
                self._rv = node.metadata.resource_version
                for c in node.status.conditions or []:
                    if c.type == wire.CONDITION_DEVICE_PLUGINS_READY:
                        item = (str(c.status), c.last_transition_time)
                        if not self.seen or self.seen[-1] != item:
                            self.seen.append(item)
                if self._stop.is_set():
                    w.stop()  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_right_after_a_kubelet_restart_gpu_pods_wait_and_then_run(gpu_node: GpuNode) -> None:
    """The kubelet restart window (tools/testenv/README.md, "Findings"): a restarted kubelet
    has no healthy devices until the plugins listed again, and charges the GPUs of pods deleted
    while it was away until its pod sources are ready, so it handed a pod bound meanwhile
    another GPU than its record's (refused: UnexpectedAdmissionError): in every run of this
    test with the condition ignored by the scheduler.
    Now the agent says so on the Node (``kallot.io/DevicePluginsReady`` False, from the
    kubelet's device checkpoint: node.kubelet_checkpoint) and kallot binds no GPU pod there
    until it is True: a GPU pod created while it is False waits, then runs with its record's
    GPU, bound after the condition turned True."""
    g = gpu_node
    g.delete_pods()
    _registered(g)
    # A whole GPU charged and its pod deleted: the restarted kubelet's checkpoint still has it.
    _run(g.node, g.v1, _gpu_pod("charged", {"nvidia.com/gpu": "1"}))
    g.delete_pods()
    conditions = _PluginsCondition(g)
    try:
        g.node.restart_kubelet()
        g.node.wait_for(
            lambda: any(s == "False" for s, _ in conditions.seen),
            60,
            "the agent's DevicePluginsReady False after the kubelet restart",
        )
        record, shown = _run(g.node, g.v1, _gpu_pod("after-kubelet", {"nvidia.com/gpu": "1"}))
        assert record is not None
        assert shown == _expected(record, _inventory(g))
        pod = g.v1.read_namespaced_pod("after-kubelet", "default")
        bound_ns = int(pod.metadata.annotations[BIND_TIME])
        seen = list(conditions.seen)
    finally:
        conditions.close()
        g.delete_pods()
    first_false = next(i for i, (s, _) in enumerate(seen) if s == "False")
    settled = [t for s, t in seen[first_false:] if s == "True"]
    assert settled, seen
    # lastTransitionTime has whole seconds: a bind in the second the condition turned True
    # passes unseen; one before that second fails.
    assert bound_ns >= int(settled[0].timestamp()) * 1_000_000_000, (bound_ns, seen)


def test_without_a_cdi_spec_for_its_names_containerd_refuses_the_container(
    gpu_node: GpuNode,
) -> None:
    """The bug this tier found: Allocate answered ``nvidia.com/gpu=<UUID>`` with no spec on
    the node defining it. With ``--cdi-devices=nvidia`` and no NVIDIA toolkit that is still what
    happens, and the kubelet says why."""
    g = gpu_node
    g.delete_pods()
    g.restart_agent("--cdi-devices=nvidia")
    try:
        g.v1.create_namespaced_pod("default", _gpu_pod("no-spec", {"nvidia.com/gpu": "1"}))

        def refused() -> str | None:
            events = [
                str(e.message)
                for e in g.v1.list_namespaced_event("default").items
                if e.involved_object.name == "no-spec"
            ]
            hits = [m for m in events if "unresolvable CDI devices" in m]
            if not hits:
                raise AssertionError(f"events of no-spec: {events}")
            return hits[0]

        message = g.node.wait_for(refused, 60, "the kubelet's event for the refused container")
        assert "nvidia.com/gpu=GPU-" in message
        assert g.v1.read_namespaced_pod("no-spec", "default").status.phase == "Pending"
    finally:
        g.delete_pods()
        g.restart_agent()


def test_a_forged_device_record_gets_no_gpu_on_the_real_kubelet(gpu_node: GpuNode) -> None:
    """The tenant's attack (docs/security.md, "device record"), through the real kubelet, with
    no admission policy installed (the agent's own check): a pod created straight onto the node
    with a record it wrote itself never starts (the kubelet's Allocate is refused), and a pod
    that asks no GPU but carries a record naming every GPU blocks nothing: kallot's next pod
    gets all three whole GPUs and runs."""
    g = gpu_node
    g.delete_pods()
    _registered(g)
    inv = _inventory(g)
    everything = json.dumps(
        {
            "v": 1,
            "node": g.node.name,
            "devices": [
                {"index": d.index, "uuid": d.uuid, "milli": 1000, "memMiB": 1, "mode": "exclusive"}
                for d in inv.devices
            ],
        }
    )
    try:
        thief = _gpu_pod("thief", {"nvidia.com/gpu": "1"})
        thief["spec"]["nodeName"] = g.node.name
        thief["spec"]["schedulerName"] = "default-scheduler"  # the record is not kallot's
        thief["metadata"]["annotations"][DEVICES_ANNOTATION] = everything
        g.v1.create_namespaced_pod("default", thief)

        def refused() -> str | None:
            pod = g.v1.read_namespaced_pod("thief", "default")
            assert pod.status.phase != "Running", "the forged record was served"
            events = [
                str(e.message)
                for e in g.v1.list_namespaced_event("default").items
                if e.involved_object.name == "thief"
            ]
            hits = [m for m in events if "refusing the record" in m]
            return hits[0] if hits else None

        message = g.node.wait_for(refused, 60, "the kubelet's event for the refused Allocate")
        assert "spec.schedulerName" in message, message

        blocker = _gpu_pod("blocker", {})
        blocker["spec"]["nodeName"] = g.node.name
        blocker["metadata"]["annotations"][DEVICES_ANNOTATION] = everything
        g.v1.create_namespaced_pod("default", blocker)
        record, shown = _run(g.node, g.v1, _gpu_pod("after", {"nvidia.com/gpu": "3"}))
        assert len(record.devices) == 3
        assert shown == _expected(record, inv)
    finally:
        g.delete_pods()


def _run(node: Node, v1: Any, body: dict[str, Any]) -> tuple[DeviceRecord, set[str]]:
    record, shown = run_gpu_pod(node, v1, body)
    assert record is not None, body["metadata"]["name"]
    return record, shown
