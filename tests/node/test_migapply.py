"""The node agent's half of the live MIG re-layout (``node.migapply``), without an API server:
the Node is an in-memory ``NodeSource`` (the plan in, the status out); the device plugin talks to
the kubelet stand-in over real unix sockets, and the pod-resources API is the harness's.

A plan is applied and re-advertised (ListAndWatch of the shrinking resource sends the smaller
list, the new resource is registered and lists the new instance), answered once per generation;
an instance the kubelet assigned (pod-resources) or a process runs on (NVML) refuses the whole
plan and nothing changes.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.config import mig_plan
from kallot.config.mig_plan import MigPlan, MigPlanStatus, PlanGpu, PlanInstance, PlanPod
from kallot.node.agent import Agent, AgentConfig
from kallot.node.allocate import PodRecord
from kallot.node.deviceplugin import StaticRecordSource, socket_name
from kallot.node.discovery import GpuProcess
from kallot.node.fake import FakeBackend
from kallot.testing.kubelet import FakeKubelet, FakePodResources, PluginClient

NODE = "gpu-m"
SEVEN = [("1g.10gb", s) for s in range(7)]
TARGET = [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]


class MemoryNode:
    """``migapply.NodeSource`` in memory: the test sets the plan; statuses are kept."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] = {"metadata": {"name": NODE, "annotations": {}}}
        self.statuses: list[MigPlanStatus] = []

    def set_plan(self, plan: MigPlan) -> None:
        self.obj["metadata"]["annotations"][mig_plan.ANNOTATION] = plan.to_json()

    async def get(self) -> dict[str, Any]:
        return self.obj

    async def watch(self, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()  # the tests call observe() themselves
        yield {}

    async def write_status(self, status: MigPlanStatus) -> None:
        self.statuses.append(status)
        self.obj["metadata"]["annotations"][mig_plan.STATUS_ANNOTATION] = status.to_json()


class Events:
    def __init__(self) -> None:
        self.node: list[str] = []
        self.pod: list[tuple[str, str]] = []

    async def on_node(self, reason: str, message: str, *, warning: bool) -> None:
        self.node.append(reason)

    async def on_pod(self, pod: PodRecord, reason: str, message: str, *, warning: bool) -> None:
        self.pod.append((pod.key, reason))


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kma-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def backend(tmp: Path) -> FakeBackend:
    spec = {
        "gpus": [
            {
                "uuid": "GPU-m-0",
                "name": "NVIDIA H100 80GB HBM3",
                "memoryMiB": 81559,
                "migEnabled": True,
                "mig": [{"name": p, "start": s, "uuid": f"MIG-m-{s}"} for p, s in SEVEN],
            }
        ]
    }
    path = tmp / "inv.yaml"
    path.write_text(yaml.safe_dump(spec))
    return FakeBackend.from_file(path)


def plan(generation: int = 1) -> MigPlan:
    return MigPlan(
        generation=generation,
        gpus=(
            PlanGpu(
                uuid="GPU-m-0",
                layout=tuple(PlanInstance(profile=p, start=s) for p, s in TARGET),
            ),
        ),
        pods=(PlanPod(namespace="ml", name="big", uid="u1"),),
    )


async def make_agent(
    sockdir: Path, fake: FakeBackend, node: MemoryNode, events: Events, pr: Path
) -> Agent:
    agent = Agent(
        AgentConfig(
            node=NODE,
            plugin_dir=sockdir,
            pod_resources_socket=pr,
            refresh_s=3600,
            watch_s=0.05,
            xid_wait_s=0.05,
            mig_reconfigure=True,
        ),
        fake,
        StaticRecordSource(),
        events=events,
        node_source=node,
    )
    await agent.start(serve_metrics=False)
    return agent


async def test_plan_is_applied_re_advertised_and_answered_once(sockdir: Path) -> None:
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    fake, node, events = backend(sockdir), MemoryNode(), Events()
    agent = await make_agent(sockdir, fake, node, events, sockdir / "no-pod-resources.sock")
    small = PluginClient(sockdir, socket_name("nvidia.com/mig-1g.10gb"))
    try:
        assert agent.reconfigurer is not None
        assert agent.inventory.devices[0].mig_reconfigurable  # published as the opt-in
        stream = small.list_and_watch()
        first = await asyncio.wait_for(stream.read(), 10)
        assert len(first.devices) == 7
        node.set_plan(plan())
        status = await agent.reconfigurer.observe(await node.get())
        assert status is not None and status.state == "Applied", status
        assert sorted(fake.mig_layout(0)) == TARGET
        update = await asyncio.wait_for(stream.read(), 10)  # the shrinking resource re-sent
        assert sorted(d.ID for d in update.devices) == [f"MIG-m-{s}" for s in range(4)]
        big = PluginClient(sockdir, socket_name("nvidia.com/mig-3g.40gb"))
        try:
            listed = await asyncio.wait_for(big.list_and_watch().read(), 10)
            (new,) = [m.uuid for m in agent.inventory.devices[0].mig if m.profile == "3g.40gb"]
            assert [d.ID for d in listed.devices] == [new]
        finally:
            await big.close()
        registered = {r.resource_name for r in kubelet.requests}
        assert "nvidia.com/mig-3g.40gb" in registered
        assert events.node == ["MigReconfigured"]
        assert events.pod == [("ml/big", "MigReconfigured")]
        scraped = {
            (m.name, s.labels.get("state")): s.value
            for m in agent.registry.collect()
            for s in m.samples
            if m.name == "kallot_agent_mig_plans"
        }
        assert scraped[("kallot_agent_mig_plans", "Applied")] == 1
        assert scraped[("kallot_agent_mig_plans", "Refused")] == 0
        # The same generation again (a watch replay, a restart): nothing more is done.
        calls = list(fake.mig_calls)
        assert await agent.reconfigurer.observe(await node.get()) is None
        assert fake.mig_calls == calls and len(node.statuses) == 1
        stream.cancel()
    finally:
        await small.close()
        await agent.stop()
        await kubelet.stop()


@pytest.mark.parametrize("holder", ["kubelet", "process"])
async def test_a_busy_instance_refuses_the_whole_plan(sockdir: Path, holder: str) -> None:
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    fake, node, events = backend(sockdir), MemoryNode(), Events()
    pr = FakePodResources(sockdir / "pod-resources.sock")
    if holder == "kubelet":  # a share on 1g@5, as the kubelet assigned it
        pr.pods[("ml", "other")] = {"c": {"kallot.io/gpu-milli": ["MIG-m-5::0", "MIG-m-5::1"]}}
    else:  # a process NVML reports on 1g@5 (a pod the records do not know)
        fake.set_processes([GpuProcess(uuid="MIG-m-5", pid=4242, used_memory_bytes=1 << 30)])
    await pr.start()
    agent = await make_agent(sockdir, fake, node, events, pr.socket)
    try:
        assert agent.reconfigurer is not None
        node.set_plan(plan())
        status = await agent.reconfigurer.observe(await node.get())
        assert status is not None and status.state == "Refused"
        assert "1g.10gb@5 (MIG-m-5" in status.message
        assert ("ml/other" in status.message) == (holder == "kubelet")
        assert fake.mig_calls == []
        assert sorted(fake.mig_layout(0)) == SEVEN
        # (the kubelet's assignment without a record is also a DeviceRecordMismatch)
        assert [r for r in events.node if r.startswith("Mig")] == ["MigReconfigurationRefused"]
        assert events.pod == [("ml/big", "MigReconfigurationRefused")]
    finally:
        await agent.stop()
        await pr.stop()
        await kubelet.stop()
