"""Start-up order on the real API server: bound pods first, then pending pods page by page, and
the first session as soon as the bound pods and one page of pending pods are in.

The property that must hold however early the first session starts: no pod is placed on a GPU
that a pod bound before the scheduler started already holds (its device record).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from kallot.cli.scheduler import build_scheduler
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.app import Controller, ControllerConfig
from kallot.kube.owners import OWNER_PATHS
from kallot.kube.state.cache import PodState
from kallot.testing.live import Cluster, inventory_node_body, pod_body

PENDING = ("fieldSelector", "spec.nodeName=")


class GatedClient(KubeClient):
    """The real client, except that the list of pending pods comes in pages of two and stops
    after its first page until ``gate`` is set: the test holds the scheduler in the state
    "bound pods known, most pending pods not listed yet" for as long as it needs."""

    def __init__(self, inner: KubeClient) -> None:
        super().__init__(inner._api)
        self.gate = asyncio.Event()
        self.pending_requests: list[Sequence[tuple[str, str]]] = []

    async def list_pages(
        self,
        path: str,
        *,
        page_size: int = 500,
        query: Sequence[tuple[str, str]] = (),
        first_query: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        pending = PENDING in query
        if pending:
            self.pending_requests.append([*query, *first_query])
        first = True
        async for page, rv in super().list_pages(
            path, page_size=2 if pending else page_size, query=query, first_query=first_query
        ):
            yield page, rv
            if pending and first:
                first = False
                await self.gate.wait()


async def _until(what: str, check: Any, task: asyncio.Task[Any], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert not task.done(), task
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _config() -> ControllerConfig:
    return ControllerConfig(leader_elect=False, metrics_port=0, watch_crds=False)


@pytest.mark.controlplane
async def test_first_session_before_the_pending_list_ends_never_reuses_bound_gpus(
    cluster: Cluster,
) -> None:
    node = f"{cluster.run}-n0"
    await asyncio.to_thread(cluster.add_nodes, [inventory_node_body(node, 8)])
    client = await KubeClient.connect(cluster.cp.kubeconfig_path)
    _, core = build_scheduler("kallot")
    # An earlier scheduler bound five pods (named to sort after the pending ones, so a list in
    # name order would bring the pending pods first): they hold five of the eight GPUs.
    held = [f"z{i}" for i in range(5)]
    body = {"nvidia.com/gpu": "1"}
    await asyncio.to_thread(cluster.create_pods, [pod_body(n, resources=body) for n in held])
    first = Controller(client, core, _config())
    task = asyncio.create_task(first.run())
    try:
        await _until(
            "the first scheduler's binds",
            lambda: all(p["spec"].get("nodeName") for p in cluster.pods()),
            task,
        )
    finally:
        first.stop()
        await asyncio.wait_for(task, 30)

    # Six pending pods, three of which fit; a new scheduler starts.
    waiting = [f"a{i}" for i in range(6)]
    await asyncio.to_thread(cluster.create_pods, [pod_body(n, resources=body) for n in waiting])
    gated = GatedClient(client)
    _, core = build_scheduler("kallot")
    ctl = Controller(gated, core, _config())
    task = asyncio.create_task(ctl.run())
    try:

        def ours() -> list[Any]:
            return [e for e in ctl.cache.pods() if e.namespace == cluster.ns]

        # The first session runs on the first page of pending pods, while the rest of the
        # pending list is held back.
        await _until("a session", lambda: ctl.sessions >= 1, task)
        listed = {e.name for e in ours()}
        assert set(held) <= listed
        assert len(listed & set(waiting)) == 2, listed
        assert not gated.gate.is_set()
        # One snapshot: the pending part is read at the bound part's resourceVersion.
        (request,) = gated.pending_requests
        assert ("resourceVersionMatch", "Exact") in request
        gated.gate.set()

        def decided() -> bool:
            mine = [e for e in ours() if e.name in waiting]
            return len(mine) == 6 and all(
                e.state is PodState.BOUND or (e.state is PodState.PENDING and e.parked_at)
                for e in mine
            )

        await _until("all six pending pods decided", decided, task)
        pods = await asyncio.to_thread(cluster.pods)
        bound = sorted(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName"))
        assert set(held) <= set(bound)
        assert len(set(bound) & set(waiting)) == 3, bound
        cluster.assert_no_overcommit(pods)
    finally:
        ctl.stop()
        await asyncio.wait_for(task, 30)
        await client.close()


@pytest.mark.controlplane
async def test_an_owner_kind_kallot_may_not_read_does_not_hold_up_start_up(
    cluster: Cluster,
) -> None:
    """kube-scheduler's identity (bootstrap RBAC) may list pods and nodes but not batch Jobs:
    the Jobs reflector is answered 403. The scheduler goes on without that owner kind (its pods
    are scheduled one by one, as with an owner kallot does not know) instead of waiting."""
    node = f"{cluster.run}-n0"
    await asyncio.to_thread(cluster.add_nodes, [inventory_node_body(node, 8)])
    await asyncio.to_thread(
        cluster.create_pods, [pod_body("p0", resources={"nvidia.com/gpu": "1"})]
    )
    client = await KubeClient.connect(cluster.cp.scheduler_kubeconfig_path)
    with pytest.raises(ApiError) as denied:  # the premise: RBAC denies it, the API serves it
        await client.list_all(OWNER_PATHS["Job"])
    assert denied.value.status == 403
    _, core = build_scheduler("kallot")
    ctl = Controller(
        client, core, ControllerConfig(leader_elect=False, metrics_port=0, watch_crds=True)
    )
    task = asyncio.create_task(ctl.run())
    try:

        def bound() -> bool:
            entry = ctl.cache.find(cluster.ns, "p0")
            return entry is not None and entry.state is PodState.BOUND

        await _until("the pod bound", bound, task)
        assert ctl.ready()
        pods = await asyncio.to_thread(cluster.pods)
        assert [p["spec"].get("nodeName") for p in pods] == [node]
    finally:
        ctl.stop()
        await asyncio.wait_for(task, 30)
        await client.close()


class NodeGatedClient(KubeClient):
    """The real client, except that the node list comes in pages of one node and stops after
    its first page until ``gate`` is set: the scheduler is held in the state "every pod known,
    one node listed"."""

    def __init__(self, inner: KubeClient) -> None:
        super().__init__(inner._api)
        self.gate = asyncio.Event()
        self.first_page: list[str] = []

    async def list_pages(
        self,
        path: str,
        *,
        page_size: int = 500,
        query: Sequence[tuple[str, str]] = (),
        first_query: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        nodes = path == "/api/v1/nodes"
        first = True
        async for page, rv in super().list_pages(
            path, page_size=1 if nodes else page_size, query=query, first_query=first_query
        ):
            if nodes and first:
                self.first_page = [n["metadata"]["name"] for n in page]
            yield page, rv
            if nodes and first:
                first = False
                await self.gate.wait()


@pytest.mark.controlplane
async def test_first_sessions_run_on_the_nodes_listed_so_far_and_report_nothing_early(
    cluster: Cluster,
) -> None:
    """The first session starts on the first page of nodes: it places pods only there, and a
    pod that fits only on a node not listed yet waits silently (no FailedScheduling), then is
    placed once the rest of the nodes are in."""
    small, large = f"{cluster.run}-a", f"{cluster.run}-b"
    await asyncio.to_thread(
        cluster.add_nodes, [inventory_node_body(small, 2), inventory_node_body(large, 8)]
    )
    one, four = {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "4"}
    names = ["s0", "s1", "s2", "s3", "big"]
    await asyncio.to_thread(
        cluster.create_pods,
        [pod_body(n, resources=four if n == "big" else one) for n in names],
    )
    client = await KubeClient.connect(cluster.cp.kubeconfig_path)
    gated = NodeGatedClient(client)
    _, core = build_scheduler("kallot")
    ctl = Controller(gated, core, _config())
    task = asyncio.create_task(ctl.run())
    try:

        def entries() -> dict[str, Any]:
            return {e.name: e for e in ctl.cache.pods() if e.namespace == cluster.ns}

        def first_session_done() -> bool:
            big = entries().get("big")
            return ctl.sessions >= 1 and big is not None and bool(big.parked_at)

        await _until("the first session", first_session_done, task)
        assert gated.first_page == [small]  # the premise: the 2-GPU node alone is listed
        assert not gated.gate.is_set()
        held = [e for e in entries().values() if e.state is not PodState.PENDING]
        assert len(held) == 2, held  # the small node's two GPUs
        assert {e.node for e in held} == {small}
        waiting = [e for e in entries().values() if e.state is PodState.PENDING]
        assert {e.name for e in waiting} >= {"big"}
        # Nothing reported unschedulable while nodes were still to come.
        assert [ctl.reporter.last_message(e.uid) for e in waiting] == [None] * len(waiting)
        gated.gate.set()

        def all_bound() -> bool:
            found = entries()
            return len(found) == len(names) and all(
                e.state is PodState.BOUND for e in found.values()
            )

        await _until("every pod bound", all_bound, task)
        pods = await asyncio.to_thread(cluster.pods)
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        assert where["big"] == large
        # Events are written by the reporter's workers after the binds: read them once every
        # write queued so far has been made, so a FailedScheduling still queued is seen too.
        await _until("the reporter's writes", ctl.reporter.idle, task)
        reasons = {e["reason"] for e in await asyncio.to_thread(cluster.events)}
        assert "FailedScheduling" not in reasons
        assert "Scheduled" in reasons  # the Events read are the ones written after the binds
        cluster.assert_no_overcommit(pods)
    finally:
        ctl.stop()
        await asyncio.wait_for(task, 30)
        await client.close()
