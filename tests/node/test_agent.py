"""The agent assembled: fake backend, kubelet harness, XIDs in, ListAndWatch/metrics/Events out."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kallot.config.inventory import NodeInventory
from kallot.node import kubelet_checkpoint
from kallot.node.agent import Agent, AgentConfig
from kallot.node.allocate import RESOURCE_GPU, RESOURCE_MILLI, PodRecord
from kallot.node.deviceplugin import StaticRecordSource, socket_name
from kallot.node.discovery import build_inventory
from kallot.node.fake import FakeBackend
from kallot.testing.kubelet import FakeKubelet, PluginClient

DATA = Path(__file__).parent / "data"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingEvents:
    def __init__(self) -> None:
        self.node: list[tuple[str, str, bool]] = []
        self.pod: list[tuple[str, str]] = []

    async def on_node(self, reason: str, message: str, *, warning: bool) -> None:
        self.node.append((reason, message, warning))

    async def on_pod(self, pod: PodRecord, reason: str, message: str, *, warning: bool) -> None:
        self.pod.append((pod.key, reason))


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[NodeInventory] = []
        self.conditions: list[tuple[bool, str]] = []

    async def publish(self, labels: dict[str, str], inv: NodeInventory) -> bool:
        self.published.append(inv)
        return True

    async def plugins_serving(self, ready: bool, message: str) -> None:
        self.conditions.append((ready, message))


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kag-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_xid_makes_gpu_unhealthy_then_it_recovers(sockdir: Path) -> None:
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    clock = Clock()
    events = RecordingEvents()
    publisher = RecordingPublisher()
    config = AgentConfig(
        node="gpu-1",
        plugin_dir=sockdir,
        sharing=backend.sharing(),
        health_recovery_s=300,
        refresh_s=3600,  # refresh only when the test calls it
        watch_s=0.05,
        xid_wait_s=0.05,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(
        config, backend, StaticRecordSource(), publisher=publisher, events=events, clock=clock
    )
    await agent.start()
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        await kubelet.next_registration()
        stream = client.list_and_watch()
        first = await asyncio.wait_for(stream.read(), 10)
        assert {d.health for d in first.devices} == {"Healthy"}
        sick = agent.inventory.devices[5].uuid
        backend.inject_xid(sick, 13)  # application error: no change
        backend.inject_xid(sick, 79)  # fallen off the bus
        update = await asyncio.wait_for(stream.read(), 10)
        assert {d.ID for d in update.devices if d.health == "Unhealthy"} == {sick}
        assert events.node == [
            ("GPUUnhealthy", f"GPU {sick}: Unhealthy (XID 79: GPU has fallen off the bus)", True)
        ]
        assert agent.health.xid_count(sick) == 2
        # The published inventory says so too (the scheduler stops placing on it).
        await agent.refresh()
        assert not publisher.published[-1].devices[5].healthy
        clock.now += 299
        await agent.refresh()
        assert agent.health.unhealthy() == {sick}
        clock.now += 1
        await agent.refresh()
        healed = await asyncio.wait_for(stream.read(), 10)
        assert {d.health for d in healed.devices} == {"Healthy"}
        assert events.node[-1][0] == "GPUHealthy" and not events.node[-1][2]
        # bool(): mypy would keep the narrowing of the assert above across the refreshes
        assert bool(publisher.published[-1].devices[5].healthy)
        assert agent.state.transitions == {(sick, "Unhealthy"): 1, (sick, "Healthy"): 1}
        assert agent.metrics_port > 0
        stream.cancel()
    finally:
        await client.close()
        await agent.stop()
        await kubelet.stop()


async def test_kallot_agent_run_registers_and_stops_on_sigterm(sockdir: Path) -> None:
    """The CLI as the DaemonSet runs it (fake backend, no API): registers, exits 0 on SIGTERM."""
    import signal
    import sys

    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kallot.cli.main",
        "agent",
        "run",
        "--no-kube",
        "--node-name=gpu-1",
        f"--inventory-file={DATA / 'mig-a100-mixed.yaml'}",
        f"--device-plugin-dir={sockdir}",
        "--metrics-address=127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        names = {(await kubelet.next_registration(timeout=60)).resource_name for _ in range(5)}
        assert names == {
            RESOURCE_GPU,
            RESOURCE_MILLI,  # the MIG instances' milli-GPUs, for shares placed on them
            "nvidia.com/mig-3g.40gb",
            "nvidia.com/mig-2g.20gb",
            "nvidia.com/mig-1g.10gb",
        }
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, out.decode()
        assert not list(sockdir.glob("kallot-*.sock"))  # its sockets are removed
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await kubelet.stop()


async def test_agent_serves_healthz_and_readyz_for_the_kubelet_probes(sockdir: Path) -> None:
    """The DaemonSet's liveness/readiness probes: 200 while every loop runs, 503 on /healthz once
    one has died (the kubelet then restarts the container); /metrics on the same port."""
    import urllib.error
    import urllib.request

    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    config = AgentConfig(
        node="gpu-1",
        plugin_dir=sockdir,
        sharing=backend.sharing(),
        refresh_s=3600,
        watch_s=0.05,
        xid_wait_s=0.05,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(config, backend, StaticRecordSource())

    def get(path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{agent.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    await agent.start()
    try:
        assert await asyncio.to_thread(get, "/healthz") == (200, "ok\n")
        assert await asyncio.to_thread(get, "/readyz") == (200, "ok\n")
        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and "DCGM_FI_DEV_GPU_UTIL" in body
        refresh = next(t for t in agent._tasks if t.get_name() == "refresh")
        refresh.cancel()
        with pytest.raises(asyncio.CancelledError):
            await refresh
        assert await asyncio.to_thread(get, "/healthz") == (503, "not ok\n")
        assert (await asyncio.to_thread(get, "/readyz"))[0] == 503
    finally:
        await agent.stop()


async def test_mps_shares_only_while_an_mps_daemon_answers(sockdir: Path) -> None:
    """With --require-mps-daemon the agent advertises MPS GPUs whole (exclusive) until a process
    holds the daemon's control FIFO open for reading, then MPS shares; a stale FIFO left by a
    dead daemon counts as none. Each change is an Event on the Node."""
    import os

    from kallot.node import mps

    pipe_dir = sockdir / "mps"
    pipe_dir.mkdir()
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    assert backend.sharing().mode == "mps"
    events = RecordingEvents()
    config = AgentConfig(
        node="gpu-1",
        plugin_dir=sockdir,
        sharing=backend.sharing(),
        refresh_s=3600,
        watch_s=0.05,
        xid_wait_s=0.05,
        metrics_address="127.0.0.1:0",
        mps_pipe_dir=str(pipe_dir),
        require_mps_daemon=True,
    )
    agent = Agent(config, backend, StaticRecordSource(), events=events)

    def modes() -> set[str]:
        return {d.mode for d in agent.inventory.devices if not d.mig}

    await agent.start()
    try:
        assert modes() == {"exclusive"}
        assert RESOURCE_MILLI not in agent.devices.resources()
        os.mkfifo(pipe_dir / mps.CONTROL)
        assert not mps.daemon_answers(pipe_dir)  # nobody reads: a stale pipe
        daemon = os.open(pipe_dir / mps.CONTROL, os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert mps.daemon_answers(pipe_dir)
            await agent.refresh()
            assert modes() == {"mps"}
            assert RESOURCE_MILLI in agent.devices.resources()
        finally:
            os.close(daemon)
        await agent.refresh()
        assert modes() == {"exclusive"}
        assert [(r, w) for r, _, w in events.node] == [
            ("MPSDaemonAnswers", False),
            ("NoMPSDaemon", True),
        ]
    finally:
        await agent.stop()


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll a condition the agent's loop makes true (no fixed sleep: it returns at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _write_checkpoint(
    path: Path, charges: list[tuple[str, str, list[str]]], registered: dict[str, list[str]]
) -> None:
    """As the kubelet writes it: a new file renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": uid,
                            "ContainerName": "main",
                            "ResourceName": res,
                            "DeviceIDs": {"-1": ids},
                            "AllocResp": "",
                        }
                        for uid, res, ids in charges
                    ],
                    "RegisteredDevices": registered,
                },
                "Checksum": 0,
            }
        )
    )
    tmp.rename(path)


async def test_the_plugins_are_ready_once_the_kubelet_took_in_the_devices_and_freed_the_gone(
    sockdir: Path,
) -> None:
    """The ``kallot.io/DevicePluginsReady`` verdict (node.kubelet_checkpoint) through the
    agent's loop: not before every ListAndWatch was taken and the kubelet rewrote its
    checkpoint since the registration, not while it charges a GPU to a pod that is gone (the
    agent asks it to free them: a list sent again), then ready, and not again after the kubelet
    restarts."""
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    gpus = [d.uuid for d in build_inventory(backend.raw(), backend.sharing()).devices]
    path = sockdir / kubelet_checkpoint.FILE
    # The checkpoint of a kubelet that came back: a pod deleted meanwhile still holds GPU 0.
    _write_checkpoint(path, [("gone", RESOURCE_GPU, [gpus[0]])], {RESOURCE_GPU: gpus})
    live = PodRecord(namespace="default", name="live", uid="live", record=None)
    publisher = RecordingPublisher()
    config = AgentConfig(
        node="gpu-1",
        plugin_dir=sockdir,
        pod_resources_socket=sockdir / "no-pod-resources.sock",
        sharing=backend.sharing(),
        refresh_s=3600,
        watch_s=0.02,
        xid_wait_s=0.05,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(config, backend, StaticRecordSource([live]), publisher=publisher)
    await agent.start()
    try:
        await _until(
            lambda: any("since we registered" in m for _, m in publisher.conditions),
            "not ready: the checkpoint is older than the registration",
        )
        assert not any(ready for ready, _ in publisher.conditions)
        advertised = {r: [d.id for d in agent.devices.of(r)] for r in agent.devices.resources()}
        lists = kubelet.lists[RESOURCE_GPU]
        _write_checkpoint(
            path, [("gone", RESOURCE_GPU, [gpus[0]]), ("live", RESOURCE_GPU, [gpus[1]])], advertised
        )
        await _until(
            lambda: "charges 1 devices" in publisher.conditions[-1][1], "not ready: stale charge"
        )
        assert gpus[0] in publisher.conditions[-1][1] and not publisher.conditions[-1][0]
        await _until(lambda: kubelet.lists[RESOURCE_GPU] > lists, "a list sent again")
        # What the kubelet writes once it freed the gone pod's GPU.
        _write_checkpoint(path, [("live", RESOURCE_GPU, [gpus[1]])], advertised)
        await _until(lambda: publisher.conditions[-1] == (True, ""), "ready")
        # Settled: a pod deleted from now on is freed at the next allocation; still ready.
        _write_checkpoint(path, [("gone-too", RESOURCE_GPU, [gpus[1]])], advertised)
        assert await agent.plugins_serving() == (True, "")
        await kubelet.restart()
        await _until(lambda: not publisher.conditions[-1][0], "not ready after a kubelet restart")
    finally:
        await agent.stop()
        await kubelet.stop()
