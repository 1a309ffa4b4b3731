"""The live scheduler behind a fault-injecting proxy (kallot.testing.faults) on the real
control plane: errors (half of the 5xx on writes after the write was applied), conflicts,
delays and cut watches; then faults off, settle, and an audit straight from the API.

The full-size run of issue 27 (600 pods, 30 nodes, 3 minutes, two seeds) is
``bench/fault_churn.py``; its numbers are in docs/design/003-live-scheduler.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.ops.reporter import PodRef, Reporter
from kallot.kube.watch.reflector import Reflector
from kallot.testing.faults import FaultMix, FaultProxy, fault_churn
from kallot.testing.live import Cluster, inventory_node_body, pod_body

pytestmark = pytest.mark.controlplane


def _pod_scheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's PodScheduled condition."""
    conds = pod.get("status", {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == "PodScheduled"), None)


@contextlib.asynccontextmanager
async def _reporting(client: KubeClient, **kwargs: Any) -> AsyncIterator[Reporter]:
    """A started Reporter; on leaving the block, every write it took has landed or failed."""
    reporter = Reporter(client, identity="t", **kwargs)
    reporter.start()
    try:
        yield reporter
        while not reporter.idle():
            await asyncio.sleep(0.05)
    finally:
        await reporter.stop(timeout=0)


def test_fault_churn_never_double_assigns_and_leaves_every_pod_explained(
    cluster: Cluster,
) -> None:
    # The fault mix, watches cut more often so that a short run sees many cuts.
    mix = FaultMix(watch_cut_s=(4.0, 12.0))
    report = fault_churn(cluster, pods=150, seconds=50, nodes=8, seed=1, mix=mix)
    print(report.summary())
    # The faults happened (otherwise the test would prove nothing) ...
    for kind in ("500", "503", "429", "409", "delay", "watch-eof", "watch-abort"):
        assert report.faults.get(kind, 0) > 0, f"no {kind} injected: {report.faults}"
    assert report.faults.get("500-applied", 0) + report.faults.get("503-applied", 0) > 0
    # ... and did no harm.
    assert report.double_held == []
    assert report.bound_without_record == []
    assert report.pending_without_reason == []
    assert report.lost == []
    assert report.cache_milli == report.records_milli
    assert report.bound > 0


def test_a_cut_watch_resumes_after_the_last_event_it_delivered(cluster: Cluster) -> None:
    # Every watch is cut after about a second, half mid-stream by an abort; pods keep coming.
    # No event may be delivered twice: each watch after a cut starts from the version of the
    # last event delivered before it (not from where the cut watch began).
    mix = FaultMix(
        error_rate=0, conflict_rate=0, delay_rate=0, watch_cut_s=(0.8, 1.2), abort_fraction=0.5
    )
    path = f"/api/v1/namespaces/{cluster.ns}/pods"
    seen: list[tuple[str, str, str]] = []

    async def scenario(proxy: FaultProxy) -> Reflector:
        kubeconfig = proxy.kubeconfig(cluster.cp.kubeconfig_path, cluster.log_dir / "k.yaml")
        client = await KubeClient.connect(kubeconfig)

        def on_event(kind: str, obj: Mapping[str, object]) -> None:
            meta = obj["metadata"]
            assert isinstance(meta, dict)
            seen.append((kind, str(meta["uid"]), str(meta["resourceVersion"])))

        r = Reflector(client, path, name="pods", on_replace=lambda items: None, on_event=on_event)
        task = asyncio.create_task(r.run())
        try:
            await r.synced.wait()
            loop = asyncio.get_running_loop()
            i = 0
            while i < 300 and min(proxy.counts["watch-abort"], proxy.counts["watch-eof"]) < 2:

                def create(i: int = i) -> list[dict[str, Any]]:
                    return cluster.create_pods([pod_body(f"w{i}")])

                await loop.run_in_executor(None, create)
                await asyncio.sleep(0.1)  # pacing: pods arrive while watches are being cut
                i += 1
            created = i
            while len({uid for _, uid, _ in seen}) < created:  # every ADDED delivered
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
        return r

    with FaultProxy(cluster.cp.server_url, cluster.cp.ca_path, seed=3, mix=mix) as proxy:
        r = asyncio.run(scenario(proxy))
        watches = list(proxy.watches)
        counts = dict(proxy.counts)
    assert counts.get("watch-abort", 0) >= 2 and counts.get("watch-eof", 0) >= 2, counts
    assert len(seen) == len(set(seen)), "an event was delivered twice"
    # Versions of successive watches never go back.
    rvs = [int(rv) for _, rv in watches]
    assert rvs == sorted(rvs), rvs
    assert r.watch_restarts >= 2


def test_client_retries_errors_and_reporter_retries_until_the_reason_lands(
    cluster: Cluster,
) -> None:
    # 70% of requests fail (500/503/429, 5xx writes half applied) and 20% of writes answer 409:
    # reads are retried by the client; a condition or Event that still fails is retried by the
    # reporter until it lands, so every pod ends up with its reason.
    mix = FaultMix(error_rate=0.7, conflict_rate=0.2, delay_rate=0, watch_cut_s=(60, 60))
    created = cluster.create_pods([pod_body(f"r{i}") for i in range(10)])
    refs = [PodRef(cluster.ns, p["metadata"]["name"], p["metadata"]["uid"]) for p in created]

    async def scenario(proxy: FaultProxy) -> tuple[Reporter, dict[int, int]]:
        kubeconfig = proxy.kubeconfig(cluster.cp.kubeconfig_path, cluster.log_dir / "k.yaml")
        client = await KubeClient.connect(kubeconfig)
        reporter = Reporter(client, identity="t", retry_initial_s=0.05, retry_max_s=0.5)
        reporter.start()
        try:
            for _ in range(10):  # reads: the client retries them (up to 4 tries)
                with contextlib.suppress(ApiError):
                    await client.get(f"/api/v1/namespaces/{cluster.ns}")
            for ref in refs:
                reporter.unschedulable(ref, f"no room for {ref.name}", "DeviceFit")
            loop = asyncio.get_running_loop()
            while not await loop.run_in_executor(None, reasons_written):
                await asyncio.sleep(0.1)
        finally:
            await reporter.stop(timeout=0)
            await client.close()
        return reporter, dict(client.retries)

    def reasons_written() -> bool:
        pods = {p["metadata"]["name"]: p for p in cluster.pods()}
        events = {e["involvedObject"]["name"] for e in cluster.events()}
        for ref in refs:
            conds = pods[ref.name].get("status", {}).get("conditions") or []
            if not any(c.get("message") == f"no room for {ref.name}" for c in conds):
                return False
            if ref.name not in events:
                return False
        return True

    with FaultProxy(cluster.cp.server_url, cluster.cp.ca_path, seed=5, mix=mix) as proxy:
        reporter, retries = asyncio.run(asyncio.wait_for(scenario(proxy), 120))
        counts = dict(proxy.counts)
    assert counts.get("409", 0) > 0 and sum(retries.values()) > 0, (counts, retries)
    assert reporter.retried > 0  # some writes failed even after the client's retries
    assert reasons_written()


def test_a_pods_newer_reason_is_never_overtaken_by_an_older_write(cluster: Cluster) -> None:
    # Half the requests wait up to 0.4 s before reaching the API server. Each pod's first reason
    # is being written when its second one comes: the second must be what stays on the pod (a
    # stale reason would then be deduplicated for minutes; issue 27, a gang's members kept
    # "waiting for the rest" after the gang was decided).
    mix = FaultMix(error_rate=0, conflict_rate=0, delay_rate=0.5, delay_s=(0.05, 0.4))
    created = cluster.create_pods([pod_body(f"o{i}") for i in range(24)])
    refs = [PodRef(cluster.ns, p["metadata"]["name"], p["metadata"]["uid"]) for p in created]

    async def scenario(proxy: FaultProxy) -> int:
        kubeconfig = proxy.kubeconfig(cluster.cp.kubeconfig_path, cluster.log_dir / "k.yaml")
        client = await KubeClient.connect(kubeconfig)
        try:
            async with _reporting(client, workers=len(refs)) as reporter:
                for ref in refs:
                    reporter.unschedulable(ref, f"first reason of {ref.name}", "GangQuorum")
                while reporter.in_flight < len(refs):  # every first write has left the queue
                    await asyncio.sleep(0)
                for ref in refs:
                    reporter.unschedulable(ref, f"second reason of {ref.name}", "Gang")
            return reporter.written
        finally:
            await client.close()

    with FaultProxy(cluster.cp.server_url, cluster.cp.ca_path, seed=11, mix=mix) as proxy:
        written = asyncio.run(asyncio.wait_for(scenario(proxy), 120))
        delays = proxy.counts.get("delay", 0)
    assert delays > 0 and written == 2 * len(refs), (delays, written)
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    stale = []
    for ref in refs:
        msg = (_pod_scheduled(pods[ref.name]) or {}).get("message")
        if msg != f"second reason of {ref.name}":
            stale.append((ref.name, msg))
    assert stale == []


def test_a_reason_written_after_the_pod_was_bound_is_put_back(cluster: Cluster) -> None:
    # The reporter's view is a moment old: "late" is bound by the time its Unschedulable write
    # reaches the API server (the binder and the reporter run side by side). The pod must not
    # stay PodScheduled=False on its node, nor get a FailedScheduling Event; "waits", which is
    # not bound, gets both.
    (node,) = cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 1)])
    created = cluster.create_pods([pod_body("late"), pod_body("waits")])
    refs = {
        p["metadata"]["name"]: PodRef(cluster.ns, p["metadata"]["name"], p["metadata"]["uid"])
        for p in created
    }

    async def scenario() -> int:
        client = await KubeClient.connect(cluster.cp.kubeconfig_path)
        late = refs["late"]
        try:
            await client.bind(late.namespace, late.name, uid=late.uid, node=node, annotations={})
            async with _reporting(client, still_pending=lambda uid: True) as reporter:
                for ref in refs.values():
                    reporter.unschedulable(ref, f"no room for {ref.name}", "DeviceFit")
            return reporter.written
        finally:
            await client.close()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 2

    def scheduled(name: str) -> tuple[str, str | None, str | None]:
        c = _pod_scheduled(cluster.pod(name)) or {}
        return c.get("status", ""), c.get("reason"), c.get("message")

    assert cluster.pod("late")["spec"]["nodeName"] == node
    assert scheduled("late") == ("True", None, None)
    assert [e for e in cluster.events("late") if e["reason"] == "FailedScheduling"] == []
    assert scheduled("waits") == ("False", "Unschedulable", "no room for waits")
    assert [e["message"] for e in cluster.events("waits")] == ["no room for waits"]


def test_a_reason_held_back_by_the_churn_limit_is_written_when_the_limit_ends(
    cluster: Cluster,
) -> None:
    # A pod's reason changes twice within the churn limit's window (one write per pod per
    # kind of failure, 1 s here instead of 30): the pod must end with its latest reason, not
    # the first one ("claim not found" while its claim's watch event was on the way).
    (created,) = cluster.create_pods([pod_body("p")])
    ref = PodRef(cluster.ns, "p", created["metadata"]["uid"])
    reasons = [
        "claim ns/c: ResourceClaim not found",
        "claim ns/c, request gpu: 1 device wanted, 0 free",
        "claim ns/c, request gpu: no device matches the selector",
    ]

    async def scenario() -> int:
        client = await KubeClient.connect(cluster.cp.kubeconfig_path)
        try:
            async with _reporting(client, repeat_s=1.0) as reporter:
                for message in reasons:
                    reporter.unschedulable(ref, message, "DynamicResources")
            return reporter.written
        finally:
            await client.close()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 2
    assert (_pod_scheduled(cluster.pod("p")) or {}).get("message") == reasons[-1]
    messages = sorted(e["message"] for e in cluster.events("p"))
    assert messages == sorted([reasons[0], reasons[-1]])


def test_a_handler_that_raises_on_one_object_does_not_end_the_watch(cluster: Cluster) -> None:
    # The handler raises on pod "bad" (standing for a bug on an unusual object): that event is
    # skipped and counted, the reflector keeps following the collection (before, the exception
    # ended its task and the cache silently stopped following the pods).
    path = f"/api/v1/namespaces/{cluster.ns}/pods"
    seen: list[str] = []

    async def scenario() -> tuple[Reflector, bool]:
        client = await KubeClient.connect(cluster.cp.kubeconfig_path)

        def on_event(kind: str, obj: Mapping[str, object]) -> None:
            meta = obj["metadata"]
            assert isinstance(meta, dict)
            if meta["name"] == "bad":
                raise RuntimeError("a handler bug")
            seen.append(str(meta["name"]))

        r = Reflector(client, path, name="pods", on_replace=lambda items: None, on_event=on_event)
        task = asyncio.create_task(r.run())
        try:
            await r.synced.wait()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: cluster.create_pods([pod_body("bad")]))
            await loop.run_in_executor(None, lambda: cluster.create_pods([pod_body("good")]))
            while "good" not in seen and not task.done():
                await asyncio.sleep(0.05)
            return r, task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()

    r, ended = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert not ended, "the reflector's task ended"
    assert "good" in seen and "bad" not in seen
    assert r.event_errors >= 1
