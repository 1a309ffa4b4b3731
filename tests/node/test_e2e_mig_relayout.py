"""Live MIG re-layout end to end (issue 21 point 7), on the real API server.

The live scheduler runs as a subprocess (kallot.testing.live); the node agent runs here with the
fake backend in device-plugin mode, its plugins on real unix sockets registered with the kubelet
stand-in (kallot.testing.kubelet), its records, Node watch, inventory and Events on the same API
server. A MIG pod whose profile needs a new layout of an idle GPU is bound only after the agent
applied and advertised it, also when the agent is killed mid-apply and started again; a GPU
whose instances in the way are busy is never re-laid out, by the scheduler's plan or by a plan
written by hand.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.config import device_record, mig_plan
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.config.inventory import NodeInventory
from kallot.core.errors import KallotError
from kallot.node.agent import Agent, AgentConfig
from kallot.node.deviceplugin import socket_name
from kallot.node.discovery import RawNode
from kallot.node.fake import FakeBackend
from kallot.node.k8s import ApiRecordSource, Events, NodeClient, Publisher
from kallot.node.migapply import ApiNodeSource
from kallot.testing.controlplane import ControlPlane
from kallot.testing.kubelet import FakeKubelet, PluginClient
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
async def kubelet() -> AsyncIterator[FakeKubelet]:
    d = Path(tempfile.mkdtemp(prefix="kmr-", dir="/tmp"))
    k = FakeKubelet(d)
    await k.start()
    yield k
    await k.stop()
    shutil.rmtree(d, ignore_errors=True)


def fake_node(node: str, layout: list[tuple[str, int]]) -> FakeBackend:
    """One H100 in MIG mode with ``layout``, as NVML would report it."""
    spec = {
        "gpus": [
            {
                "uuid": f"GPU-{node}-0",
                "name": H100,
                "memoryMiB": 81559,
                "migEnabled": True,
                "mig": [{"name": p, "start": s, "uuid": f"MIG-{node}-0-{s}"} for p, s in layout],
            }
        ]
    }
    path = Path(tempfile.mkdtemp(prefix="kmr-inv-", dir="/tmp")) / "inv.yaml"
    path.write_text(yaml.safe_dump(spec))
    return FakeBackend.from_file(path)


class DiesInCreate:
    """The fake backend, but the agent 'dies' inside its first create_mig: the call blocks
    until the test has stopped that agent, then fails without creating anything."""

    def __init__(self, fake: FakeBackend) -> None:
        self.fake = fake
        self.entered = threading.Event()
        self.gate = threading.Event()

    def raw(self) -> RawNode:
        return self.fake.raw()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        self.entered.set()
        self.gate.wait(120)
        raise KallotError("the agent process is gone")

    def destroy_mig(self, gpu_index: int, start: int) -> None:
        self.fake.destroy_mig(gpu_index, start)


@dataclass
class RunningAgent:
    agent: Agent
    api: NodeClient

    async def stop(self) -> None:
        await self.agent.stop()
        await self.api.close()


async def start_agent(
    node_cp: ControlPlane, node: str, backend: Any, kubelet: FakeKubelet
) -> RunningAgent:
    api = await NodeClient.connect(node_cp.kubeconfig_path)
    config = AgentConfig(
        node=node,
        plugin_dir=kubelet.dir,
        refresh_s=3600,  # refreshes only at start and after a re-layout
        watch_s=0.1,
        xid_wait_s=0.05,
        mig_reconfigure=True,
    )
    agent = Agent(
        config,
        backend,
        ApiRecordSource(api, node),
        publisher=Publisher(api, node),
        events=Events(api, node),
        node_source=ApiNodeSource(api, node),
    )
    await agent.start(serve_metrics=False)
    return RunningAgent(agent, api)


def node_obj(cluster: Cluster, name: str) -> dict[str, Any]:
    resp = cluster.v1.read_node(name, _preload_content=False)
    out: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response
    return out


def node_annotations(cluster: Cluster, node: str) -> dict[str, str]:
    return node_obj(cluster, node)["metadata"].get("annotations") or {}


def published(cluster: Cluster, node: str) -> NodeInventory | None:
    text = node_annotations(cluster, node).get(INVENTORY_ANNOTATION, "")
    inv = NodeInventory.from_json(text) if text else None
    return inv if inv is not None and inv.devices and inv.devices[0].mig_reconfigurable else None


def bound(cluster: Cluster, name: str) -> dict[str, Any] | None:
    pod = cluster.pod(name)
    return pod if pod["spec"].get("nodeName") else None


def record(pod: dict[str, Any]) -> DeviceRecord:
    return DeviceRecord.from_json(pod["metadata"]["annotations"][device_record.ANNOTATION])


def mig_pod(name: str, profile: str) -> dict[str, Any]:
    return pod_body(name, resources={f"nvidia.com/mig-{profile}": "1"})


def node_events(cluster: Cluster, node: str) -> list[tuple[str, str]]:
    resp = cluster.v1.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}", _preload_content=False
    )
    return [(e["reason"], e["message"]) for e in json.loads(resp.data)["items"]]  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response


async def test_pod_needing_a_relayout_is_bound_after_the_agent_applies_it_across_a_restart(
    cluster: Cluster, node_cp: ControlPlane, kubelet: FakeKubelet
) -> None:
    # One H100 cut in seven 1g.10gb. A 3g.40gb pod needs a new layout: the scheduler keeps the
    # busy 1g@0 and destroys the fewest idle instances (1g@4, @5, @6) for a 3g.40gb at 4.
    node = f"{cluster.run}-mr"
    fake = fake_node(node, [("1g.10gb", s) for s in range(7)])
    dies = DiesInCreate(fake)
    await asyncio.to_thread(cluster.add_nodes, [inventory_node_body(node, 1)])
    first = await start_agent(node_cp, node, dies, kubelet)
    second: RunningAgent | None = None
    try:
        await asyncio.to_thread(
            wait_until, lambda: published(cluster, node), timeout=30, what="agent's inventory"
        )
        s = cluster.scheduler()
        await asyncio.to_thread(cluster.create_pods, [mig_pod("small", "1g.10gb")])
        small = await asyncio.to_thread(
            wait_until,
            lambda: s.check_alive() and bound(cluster, "small"),
            timeout=60,
            what="small bound",
        )
        (dev,) = record(small).devices
        assert dev.mig is not None and (dev.mig.profile, dev.mig.start) == ("1g.10gb", 0)

        await asyncio.to_thread(cluster.create_pods, [mig_pod("big", "3g.40gb")])
        # The agent destroyed the idle instances and 'dies' in the create.
        assert await asyncio.to_thread(dies.entered.wait, 90), "the agent got no plan"
        plan = mig_plan.MigPlan.from_json(node_annotations(cluster, node)[mig_plan.ANNOTATION])
        (gpu,) = plan.gpus
        target = [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]
        assert sorted(gpu.instances()) == target
        assert [(p.namespace, p.name) for p in plan.pods] == [(cluster.ns, "big")]
        assert sorted(fake.mig_layout(0)) == target[:4]  # half applied
        assert bound(cluster, "big") is None  # never bound against a layout not advertised
        await first.stop()
        dies.gate.set()

        # A new agent reads the layout back from the backend and only creates what is missing.
        second = await start_agent(node_cp, node, fake, kubelet)
        big = await asyncio.to_thread(
            wait_until,
            lambda: s.check_alive() and bound(cluster, "big"),
            timeout=90,
            what="big bound",
        )
        (dev,) = record(big).devices
        assert dev.mig is not None and (dev.mig.profile, dev.mig.start) == ("3g.40gb", 4)
        assert sorted(fake.mig_layout(0)) == target
        assert [c for c in fake.mig_calls if c[0] == "create"] == [("create", 0, "3g.40gb", 4)]
        assert sorted(c[3] for c in fake.mig_calls if c[0] == "destroy") == [4, 5, 6]

        # The scheduler binds once the inventory shows the new layout; the agent writes its
        # status after that inventory and its Events after the status, and the scheduler's
        # own Planned Events go out through its reporter: wait for the answer to the plan and,
        # when it is Applied, for the Events on the node and on the pod.
        def told() -> tuple[mig_plan.MigPlanStatus, set[str], set[str]] | None:
            text = node_annotations(cluster, node).get(mig_plan.STATUS_ANNOTATION)
            status = mig_plan.MigPlanStatus.from_json(text) if text else None
            if status is None or status.generation < plan.generation:
                return None
            reasons = {r for r, _ in node_events(cluster, node)}
            pod_reasons = {e["reason"] for e in cluster.events("big")}
            want = {"MigReconfigurationPlanned", "MigReconfigured"}
            if status.state == "Applied" and not (want <= reasons and want <= pod_reasons):
                return None
            return status, reasons, pod_reasons

        status, reasons, pod_reasons = await asyncio.to_thread(
            wait_until, told, timeout=30, what="the agent's answer and the Events"
        )
        assert (status.generation, status.state) == (plan.generation, "Applied")
        inv = published(cluster, node)
        assert inv is not None
        assert sorted((m.profile, m.start) for m in inv.devices[0].mig) == target
        (new,) = [m.uuid for m in inv.devices[0].mig if m.profile == "3g.40gb"]

        # The kubelet sees the new resource and is handed the new instance for the pod.
        resource = "nvidia.com/mig-3g.40gb"
        plugin = PluginClient(kubelet.dir, socket_name(resource))
        try:
            listed = await asyncio.wait_for(plugin.list_and_watch().read(), 10)
            assert [d.ID for d in listed.devices] == [new]
            resp = await plugin.allocate([new])
            assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == new
        finally:
            await plugin.close()

        assert {"MigReconfigurationPlanned", "MigReconfigured"} <= reasons
        assert {"MigReconfigurationPlanned", "MigReconfigured"} <= pod_reasons
        cluster.assert_no_overcommit()
    finally:
        dies.gate.set()
        if second is not None:
            await second.stop()
        else:
            await first.stop()


async def test_a_gpu_whose_instances_in_the_way_are_busy_is_never_relaid_out(
    cluster: Cluster, node_cp: ControlPlane, kubelet: FakeKubelet
) -> None:
    # 1g.10gb@0 and 3g.40gb@4, both taken by pods: a second 3g.40gb fits only by destroying
    # one of them, so the scheduler plans nothing and the pod waits.
    node = f"{cluster.run}-busy"
    fake = fake_node(node, [("1g.10gb", 0), ("3g.40gb", 4)])
    await asyncio.to_thread(cluster.add_nodes, [inventory_node_body(node, 1)])
    agent = await start_agent(node_cp, node, fake, kubelet)
    try:
        await asyncio.to_thread(
            wait_until, lambda: published(cluster, node), timeout=30, what="agent's inventory"
        )
        s = cluster.scheduler()
        for name, profile in (("a", "3g.40gb"), ("b", "1g.10gb")):
            await asyncio.to_thread(cluster.create_pods, [mig_pod(name, profile)])

            def alive_and_bound(n: str = name) -> object:
                return s.check_alive() and bound(cluster, n)

            await asyncio.to_thread(
                wait_until,
                alive_and_bound,
                timeout=60,
                what=f"{name} bound",
            )
        await asyncio.to_thread(cluster.create_pods, [mig_pod("c", "3g.40gb")])

        def unschedulable() -> bool:
            conds = cluster.pod("c").get("status", {}).get("conditions") or []
            return any(x["type"] == "PodScheduled" and x["status"] == "False" for x in conds)

        await asyncio.to_thread(
            wait_until, lambda: s.check_alive() and unschedulable(), timeout=60, what="c waits"
        )
        assert bound(cluster, "c") is None
        assert mig_plan.ANNOTATION not in node_annotations(cluster, node)
        assert fake.mig_calls == []

        # A plan written by hand (a stale scheduler) that destroys the busy 1g@0: the agent
        # checks the pods' records and refuses; nothing changes on the GPU.
        bad = mig_plan.MigPlan(
            generation=1,
            gpus=(
                mig_plan.PlanGpu(
                    uuid=f"GPU-{node}-0",
                    layout=(
                        mig_plan.PlanInstance(profile="3g.40gb", start=0),
                        mig_plan.PlanInstance(profile="3g.40gb", start=4),
                    ),
                ),
            ),
            pods=(
                mig_plan.PlanPod(
                    namespace=cluster.ns, name="c", uid=cluster.pod("c")["metadata"]["uid"]
                ),
            ),
        )
        await asyncio.to_thread(
            cluster.v1.patch_node,
            node,
            {"metadata": {"annotations": {mig_plan.ANNOTATION: bad.to_json()}}},
        )

        def answered() -> mig_plan.MigPlanStatus | None:
            text = node_annotations(cluster, node).get(mig_plan.STATUS_ANNOTATION)
            return mig_plan.MigPlanStatus.from_json(text) if text else None

        status = await asyncio.to_thread(wait_until, answered, timeout=30, what="agent's answer")
        assert (status.generation, status.state) == (1, "Refused")
        assert "1g.10gb@0" in status.message and f"{cluster.ns}/b" in status.message
        assert fake.mig_calls == []
        assert sorted(fake.mig_layout(0)) == [("1g.10gb", 0), ("3g.40gb", 4)]
        # The agent writes its Events after the status: wait for them.
        await asyncio.to_thread(
            wait_until,
            lambda: (
                "MigReconfigurationRefused" in {r for r, _ in node_events(cluster, node)}
                and "MigReconfigurationRefused" in {e["reason"] for e in cluster.events("c")}
            ),
            timeout=30,
            what="the MigReconfigurationRefused Events on the node and on c",
        )
        assert bound(cluster, "c") is None
    finally:
        await agent.stop()
