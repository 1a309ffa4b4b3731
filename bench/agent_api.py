"""API requests of one node agent per minute: a LIST per read (before) vs the pod informer.

A real etcd + kube-apiserver (``kallot.testing.controlplane``), one Node, the agent
(``node.agent.Agent``: fake backend with 8 H100s, the API record source, publisher and events)
serving the device plugin to the kubelet stand-in. Every ``--pod-every`` seconds a pod with a
device record (one whole GPU) is bound to the node, the stand-in kubelet calls
GetPreferredAllocation and Allocate for it, and the pod is deleted again 30 s later; the agent
refreshes every 10 s (its default). The same schedule runs twice, in the same process: with
``pods()`` a LIST per call (the agent before issue #21) and with the node-scoped informer
(LIST + WATCH ``spec.nodeName``). Requests are counted at the agent's own client, by verb.

    python bench/agent_api.py --seconds 60 --pod-every 5
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from kallot.config import device_record
from kallot.config.device_record import DeviceRecord, RecordDevice
from kallot.node.agent import Agent, AgentConfig
from kallot.node.allocate import RESOURCE_GPU
from kallot.node.deviceplugin import socket_name
from kallot.node.fake import FakeBackend
from kallot.node.k8s import ApiRecordSource, Events, NodeClient, Publisher
from kallot.testing.controlplane import ControlPlane
from kallot.testing.kubelet import FakeKubelet, PluginClient

DATA = Path(__file__).parent.parent / "tests" / "node" / "data"


class CountingClient(NodeClient):
    """The agent's client, counting requests by verb and kind."""

    def __init__(self, inner: NodeClient) -> None:
        super().__init__(inner._api)
        self.by: Counter[str] = Counter()

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        kind = "LIST pods" if method == "GET" and path == "/api/v1/pods" else method
        self.by[kind] += 1
        return await super().request(method, path, **kw)

    async def watch(self, path: str, **kw: Any) -> Any:
        self.by["WATCH"] += 1
        async for event in super().watch(path, **kw):
            yield event


class ListPerRead(ApiRecordSource):
    """The agent before the informer: never started, so every ``pods()`` is a LIST."""

    async def start(self) -> None:
        return None


async def run(plane: ControlPlane, mode: str, seconds: float, pod_every: float) -> Counter[str]:
    node = f"bench-{mode}"
    admin = await NodeClient.connect(plane.kubeconfig_path)
    await admin.request(
        "POST",
        "/api/v1/nodes",
        body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
    )
    api = CountingClient(await NodeClient.connect(plane.kubeconfig_path))
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    sockdir = Path(tempfile.mkdtemp(prefix="kab-", dir="/tmp"))
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    source = (ListPerRead if mode == "list" else ApiRecordSource)(api, node)
    agent = Agent(
        AgentConfig(node=node, plugin_dir=sockdir, metrics_address="127.0.0.1:0"),
        backend,
        source,
        publisher=Publisher(api, node),
        events=Events(api, node),
    )
    await agent.start(serve_metrics=False)
    inv = agent.inventory
    gpu = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    loop = asyncio.get_running_loop()
    api.by.clear()  # count the steady state, not the start
    end = loop.time() + seconds
    k = 0
    live: list[tuple[float, str]] = []
    try:
        while loop.time() < end:
            slot = k % len(inv.devices)
            record = DeviceRecord(
                node=node,
                devices=(
                    RecordDevice(
                        index=slot,
                        uuid=inv.devices[slot].uuid,
                        milli=1000,
                        mem_mib=inv.devices[slot].mem_mib,
                        mode="exclusive",
                    ),
                ),
            )
            name = f"{mode}-p{k}"
            await admin.request(
                "POST",
                "/api/v1/namespaces/default/pods",
                body={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "annotations": {
                            device_record.ANNOTATION: record.to_json(),
                            device_record.BIND_TIME: str(k + 1),
                        },
                    },
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                },
            )
            ids = await gpu.preferred([d.uuid for d in inv.devices], 1)
            await gpu.allocate(ids)
            live.append((loop.time() + 30, name))
            while live and live[0][0] <= loop.time():
                await admin.request(
                    "DELETE",
                    f"/api/v1/namespaces/default/pods/{live.pop(0)[1]}",
                    query=[("gracePeriodSeconds", "0")],
                )
            k += 1
            await asyncio.sleep(pod_every)
    finally:
        counted = Counter(api.by)
        await gpu.close()
        await agent.stop()
        await kubelet.stop()
        await api.close()
        await admin.close()
        shutil.rmtree(sockdir, ignore_errors=True)
    counted["pods"] = k
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pod-every", type=float, default=5.0)
    args = parser.parse_args()
    with ControlPlane(scheduler=False) as plane:
        rows = {
            m: asyncio.run(run(plane, m, args.seconds, args.pod_every))
            for m in ("list", "informer")
        }
    per_min = 60.0 / args.seconds
    kinds = sorted({k for c in rows.values() for k in c if k != "pods"})
    print(f"{args.seconds:.0f} s per mode, a pod every {args.pod_every:g} s, refresh every 10 s")
    print("| mode | pods | " + " | ".join(f"{k} /min" for k in kinds) + " | all /min |")
    print("|---|---|" + "---|" * (len(kinds) + 1))
    for mode, c in rows.items():
        total = sum(v for k, v in c.items() if k != "pods")
        cells = " | ".join(f"{c[k] * per_min:.1f}" for k in kinds)
        print(f"| {mode} | {c['pods']} | {cells} | {total * per_min:.1f} |")


if __name__ == "__main__":
    main()
