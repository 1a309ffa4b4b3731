"""Model servers on the real control plane: the node agent's model-cache watch publishes each
node's cache, the scheduler places a pod where its weights are and follows the caches as they
change, and the disruption guard sets and clears karpenter.sh/do-not-disrupt from readiness, the
grace window and the last ready replica."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from kubernetes import client

from kallot.config import model_cache, presets
from kallot.config.model_cache import ModelCacheInventory
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.kube.state.cache import Cache
from kallot.node import models
from kallot.node.k8s import NodeClient
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

DND = "karpenter.sh/do-not-disrupt"
GUARD = "kallot.io/disruption-guard"


def hub_model(root: Path, org: str, name: str, rev: str) -> None:
    snap = root / f"models--{org}--{name}" / "snapshots" / rev
    blobs = root / f"models--{org}--{name}" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir(exist_ok=True)
    (blobs / "w").write_bytes(b"\0" * 2**20)
    (snap / "model.safetensors").symlink_to(os.path.relpath(blobs / "w", snap))
    (snap / "config.json").write_text("{}")


def remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
    path.rmdir()


class Agents:
    """The model-cache part of the node agent (watch + publisher) for several nodes, on an
    event loop of its own."""

    def __init__(self, kubeconfig: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client: NodeClient = self._run(NodeClient.connect(kubeconfig))
        self.tasks: list[asyncio.Task[None]] = []

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def watch(self, node: str, root: Path) -> None:
        config = models.ModelCacheConfig(roots=(root,), read_bytes_per_s=2e9, debounce_s=0.2)
        watcher = models.ModelCacheWatcher(config, models.ModelCachePublisher(self.client, node))

        async def start() -> asyncio.Task[None]:
            return asyncio.create_task(watcher.run())

        self.tasks.append(self._run(start()))

    def close(self) -> None:
        async def stop() -> None:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.client.close()

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def agents(cluster: Cluster) -> Iterator[Agents]:
    a = Agents(str(cluster.cp.kubeconfig_path))
    try:
        yield a
    finally:
        a.close()


def published(cluster: Cluster, node: str) -> set[str] | None:
    meta = cluster.v1.read_node(node).metadata
    assert meta is not None
    ann = meta.annotations or {}
    text = ann.get(model_cache.ANNOTATION)
    return None if text is None else {m.key for m in ModelCacheInventory.from_json(text).models}


def server(name: str, model: str) -> dict[str, Any]:
    return pod_body(
        name,
        resources={"nvidia.com/gpu": "1"},
        annotations={"kallot.io/model": model, "kallot.io/model-size": "140Gi"},
    )


def node_of(cluster: Cluster, name: str) -> str:
    return str(
        wait_until(
            lambda: cluster.pod(name)["spec"].get("nodeName"), timeout=60, what=f"{name} bound"
        )
    )


def blind_choice(cluster: Cluster) -> set[str]:
    """Where kallot without the ModelCache plugin puts the pending pods in the scheduler's first
    session (same objects, same seed; like test_binding)."""
    nodes = cluster.v1.list_node(label_selector=f"kallot.test/run={cluster.run}")
    offline = Cache()
    offline.replace_nodes([cluster.api.sanitize_for_serialization(n) for n in nodes.items])  # type: ignore[no-untyped-call]  # the kubernetes ApiClient is untyped here
    offline.replace_pods(cluster.pods())
    inp = offline.session_input(max_tasks=2000)
    base = presets.PROFILES["kallot"]
    blind = dataclasses.replace(base, score=tuple(x for x in base.score if x[0] != "ModelCache"))
    core = Scheduler(Framework(blind, policies.builtin_registry()))
    decision = core.run_session(
        inp.snapshot, list(inp.tasks), now=time.time(), rng=np.random.default_rng(0), jobs=inp.jobs
    )
    return {inp.snapshot.node_names[p.node_row] for p in decision.placements}


BARRIER = "kallot.test/barrier"


def seen_by_scheduler(cluster: Cluster, nodes: list[str]) -> None:
    """Returns once the scheduler's node watch has delivered what the API holds now for
    ``nodes`` (their annotations read above): each node gets a label in a later update, and a
    GPU-less pod that only that label lets in is bound there. A watch delivers one object's
    updates in order, so the label's arrival means the annotations' too. The pods are deleted
    again (GPU-less, they change no GPU score; but no bound pod is left without a device
    record for the final check)."""
    for node in nodes:
        cluster.v1.patch_node(node, {"metadata": {"labels": {BARRIER: node}}})
    names = [f"barrier-{i}" for i in range(len(nodes))]
    bodies = [pod_body(name) for name in names]
    for body, node in zip(bodies, nodes, strict=True):
        body["spec"]["nodeSelector"] = {BARRIER: node}
    cluster.create_pods(bodies)
    assert [node_of(cluster, name) for name in names] == nodes
    for name in names:
        cluster.delete_pod(name)
    wait_until(
        lambda: not {p["metadata"]["name"] for p in cluster.pods()} & set(names),
        timeout=60,
        what="barrier pods deleted",
    )


def test_pods_follow_the_published_model_caches(
    cluster: Cluster, agents: Agents, tmp_path: Path
) -> None:
    nodes = cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(4)])
    cluster.create_pods([server(f"llama-{i}", "org/llama@r1") for i in range(3)])
    # The weights go where kallot would not put these pods without them.
    blind = blind_choice(cluster)
    cached = next(n for n in reversed(nodes) if n not in blind)
    roots = {n: tmp_path / n for n in nodes}
    for node, root in roots.items():
        root.mkdir()
        agents.watch(node, root)
    hub_model(roots[cached], "org", "llama", "r1")
    wait_until(lambda: published(cluster, cached) == {"org/llama@r1"}, timeout=60, what="cache")
    for node in nodes:
        if node != cached:

            def emptied(n: str = node) -> bool:
                return published(cluster, n) == set()

            wait_until(emptied, timeout=60, what=node)

    s = cluster.scheduler(extra=["--disruption-grace=-1"])
    assert [node_of(cluster, f"llama-{i}") for i in range(3)] == [cached] * 3

    # The caches change: a second model arrives on another node (and only there), the first
    # leaves; the inventory follows and so do the next pods.
    other = next(n for n in nodes if n != cached)
    hub_model(roots[other], "org", "mistral", "r7")
    remove_tree(roots[cached] / "models--org--llama")
    wait_until(lambda: published(cluster, other) == {"org/mistral@r7"}, timeout=60, what="new")
    wait_until(lambda: published(cluster, cached) == set(), timeout=60, what="evicted")
    seen_by_scheduler(cluster, [other, cached])
    cluster.create_pods([server(f"mistral-{i}", "org/mistral@r7") for i in range(2)])
    assert [node_of(cluster, f"mistral-{i}") for i in range(2)] == [other] * 2
    s.check_alive()
    cluster.assert_no_overcommit()


def set_ready(cluster: Cluster, name: str, ago_s: float) -> None:
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago_s)
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.v1.patch_namespaced_pod_status(
        name,
        cluster.ns,
        {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": stamp},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
                ],
            }
        },
    )


def guard(cluster: Cluster, name: str) -> tuple[str | None, str | None]:
    ann = cluster.pod(name)["metadata"].get("annotations") or {}
    return ann.get(DND), ann.get(GUARD)


def test_do_not_disrupt_follows_loading_grace_and_last_replica(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 8)])
    s = cluster.scheduler(extra=["--disruption-grace=20"])
    cluster.create_pods([server("a", "org/m@r1")])
    node_of(cluster, "a")
    # bound, not Ready: loading
    wait_until(lambda: guard(cluster, "a") == ("true", "loading"), timeout=60, what="a loading")
    set_ready(cluster, "a", 0)
    wait_until(lambda: guard(cluster, "a") == ("true", "grace"), timeout=60, what="a in grace")
    # past the grace window it is still the last ready replica of its model
    wait_until(
        lambda: guard(cluster, "a") == ("true", "last-ready-replica"),
        timeout=60,
        what="a: last ready replica",
    )
    # a second replica becomes Ready long ago: neither is the last one, both are released
    cluster.create_pods([server("b", "org/m@r1")])
    node_of(cluster, "b")
    wait_until(lambda: guard(cluster, "b") == ("true", "loading"), timeout=60, what="b loading")
    set_ready(cluster, "b", 3600)
    wait_until(
        lambda: guard(cluster, "a") == (None, None) and guard(cluster, "b") == (None, None),
        timeout=60,
        what="both released",
    )
    s.check_alive()


CRDS = Path(__file__).resolve().parents[2] / "charts" / "kallot" / "crds"


@pytest.fixture
def two_teams(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Queues a and b, each guaranteed 2 GPUs (as in test_queues_live), deleted afterwards."""
    cluster.install_crds([yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))])
    api = client.CustomObjectsApi(cluster.api)
    names = (f"{cluster.run}-a", f"{cluster.run}-b")
    for name in names:
        api.create_cluster_custom_object(
            "kallot.io",
            "v1alpha1",
            "queues",
            {
                "apiVersion": "kallot.io/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"resources": {"gpu": {"quota": 2}}},
            },
        )
    try:
        yield names
    finally:
        for name in names:
            api.delete_cluster_custom_object("kallot.io", "v1alpha1", "queues", name)


def test_reclaim_takes_plain_pods_not_loading_model_servers(
    cluster: Cluster, two_teams: tuple[str, str]
) -> None:
    a, b = two_teams
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 4)])
    s = cluster.scheduler()
    gpu = {"nvidia.com/gpu": "1"}
    team_a = {"kallot.io/queue": a}
    cluster.create_pods([pod_body(f"plain-{i}", resources=gpu, labels=team_a) for i in range(2)])
    for i in range(2):
        node_of(cluster, f"plain-{i}")
    # Team a borrows team b's idle guarantee for two model servers, which start loading.
    servers = [server(f"llama-{i}", "org/llama@r1") for i in range(2)]
    for body in servers:
        body["metadata"]["labels"] = dict(team_a)
    cluster.create_pods(servers)
    for i in range(2):
        node_of(cluster, f"llama-{i}")
    # Team b wants its guarantee back: two of team a's pods go. The servers are the cheapest
    # victims by GPU-hours lost (they just started), but they are loading: the plain pods go.
    cluster.create_pods(
        [pod_body(f"b-{i}", resources=gpu, labels={"kallot.io/queue": b}) for i in range(2)]
    )
    for i in range(2):
        node_of(cluster, f"b-{i}")
    names = {p["metadata"]["name"] for p in cluster.pods()}
    assert {"llama-0", "llama-1"} <= names
    assert not names & {"plain-0", "plain-1"}
    for i in range(2):

        def preempted(i: int = i) -> list[dict[str, Any]]:
            return [e for e in cluster.events(f"plain-{i}") if e["reason"] == "Preempted"]

        wait_until(
            preempted,
            timeout=30,
            what=f"a Preempted Event on plain-{i}",
        )
    s.check_alive()
    cluster.assert_no_overcommit()
