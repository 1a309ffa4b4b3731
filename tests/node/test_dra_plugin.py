"""The kubelet DRA plugin (``node.draplugin``) against the kubelet stand-in over real unix sockets
and the upstream protos; claims are real ResourceClaims in a real kube-apiserver, their
allocation written the way a scheduler writes it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kallot.config.inventory import NodeInventory
from kallot.core import mig as core_mig
from kallot.node import dra
from kallot.node.discovery import XidEvent, build_inventory
from kallot.node.dra_api import ApiClaimSource
from kallot.node.draplugin import CDI_KIND, DraConfig, DraDriver
from kallot.node.fake import FakeBackend
from kallot.node.k8s import NodeClient
from kallot.node.proto import dra_health_v1_pb2 as hpb
from kallot.node.proto import dra_health_v1alpha1_pb2 as hpb_alpha
from kallot.testing.kubelet import DraKubelet

pytestmark = pytest.mark.controlplane

DATA = Path(__file__).parent / "data"
NODE = "dra-node"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def _inventory(fake: FakeBackend) -> NodeInventory:
    return build_inventory(fake.raw(), fake.sharing())


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="kdra-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend.from_file(DATA / "dra-a100-3.yaml")


def _config(sockdir: Path, cdi_dir: Path | None = None) -> DraConfig:
    return DraConfig(
        node=NODE,
        registry_dir=sockdir / "plugins_registry",
        plugins_dir=sockdir / "plugins",
        cdi_dir=cdi_dir or sockdir / "cdi",
    )


@pytest.fixture
async def driver(sockdir: Path, fake: FakeBackend, client: NodeClient) -> AsyncIterator[DraDriver]:
    d = DraDriver(_config(sockdir), _inventory(fake), ApiClaimSource(client), fake)
    await d.start()
    yield d
    await d.stop()


@pytest.fixture
async def kubelet(sockdir: Path, driver: DraDriver) -> AsyncIterator[DraKubelet]:
    k = DraKubelet(sockdir / "plugins_registry")
    await k.register(dra.DRIVER)
    yield k
    await k.close()


async def make_claim(
    client: NodeClient,
    results: list[dict[str, Any]],
    *,
    config: list[dict[str, Any]] | None = None,
    requests: tuple[str, ...] = ("gpu",),
    capacity: dict[str, str] | None = None,
) -> tuple[str, str, str]:
    """A ResourceClaim with ``status.allocation`` = ``results`` (as a scheduler writes it);
    returns (namespace, name, uid)."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    exactly: dict[str, Any] = {"deviceClassName": "gpu.kallot.io"}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": r, "exactly": exactly} for r in requests]}},
    }
    created = await client.request("POST", CLAIMS, body=body)
    alloc: dict[str, Any] = {"devices": {"results": results}}
    if config:
        alloc["devices"]["config"] = config
    await client.request(
        "PATCH",
        f"{CLAIMS}/{name}/status",
        body={"status": {"allocation": alloc}},
        content_type="application/merge-patch+json",
    )
    return ("default", name, created["metadata"]["uid"])


def result(device: str, *, pool: str = NODE, request: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": dra.DRIVER, "pool": pool, "device": device, **extra}


def cdi_spec(driver: DraDriver, uid: str) -> dict[str, Any]:
    files = list(driver.config.cdi_dir.glob(f"*{uid}*.json"))
    assert len(files) == 1, files
    doc: dict[str, Any] = json.loads(files[0].read_text())
    return doc


def env_of(spec: dict[str, Any], k: int = 0) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][k]["containerEdits"]["env"])


async def test_registration_names_the_driver_and_the_endpoint(
    driver: DraDriver, kubelet: DraKubelet, sockdir: Path
) -> None:
    assert kubelet.info is not None
    assert kubelet.info.name == "gpu.kallot.io"
    assert kubelet.info.endpoint == str(sockdir / "plugins" / "gpu.kallot.io" / "dra.sock")
    assert (sockdir / "plugins_registry" / "gpu.kallot.io-reg.sock").is_socket()
    assert [r.plugin_registered for r in driver.registrations] == [True]


async def test_prepare_writes_a_cdi_spec_whose_devices_are_the_returned_ids(
    driver: DraDriver, kubelet: DraKubelet, client: NodeClient
) -> None:
    claim = await make_claim(client, [result("gpu-1")])
    answer = (await kubelet.prepare(claim))[claim[2]]
    assert answer.error == ""
    (dev,) = answer.devices
    assert (dev.pool_name, dev.device_name, list(dev.request_names)) == (NODE, "gpu-1", ["gpu"])
    spec = cdi_spec(driver, claim[2])
    assert spec["kind"] == CDI_KIND
    assert [f"{spec['kind']}={d['name']}" for d in spec["devices"]] == list(dev.cdi_device_ids)
    env = env_of(spec)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-5a3c9f1e-0401-4e4e-8a55-000000000000"
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia1"
    assert "/dev/nvidiactl" in nodes


async def test_prepare_twice_same_answer_unprepare_twice_harmless(
    driver: DraDriver, kubelet: DraKubelet, client: NodeClient
) -> None:
    claim = await make_claim(client, [result("gpu-1")])
    first = (await kubelet.prepare(claim))[claim[2]]
    second = (await kubelet.prepare(claim))[claim[2]]
    assert first.SerializeToString(deterministic=True) == second.SerializeToString(
        deterministic=True
    )
    for _ in range(2):
        assert (await kubelet.unprepare(claim))[claim[2]].error == ""
    assert not list(driver.config.cdi_dir.glob(f"*{claim[2]}*"))
    assert claim[2] not in driver.checkpoint.claims


async def test_mps_share_gets_its_limits_from_the_consumed_capacity(
    driver: DraDriver, kubelet: DraKubelet, client: NodeClient
) -> None:
    share = str(uuid.uuid4())
    claim = await make_claim(
        client,
        [result("gpu-2", shareID=share, consumedCapacity={"memory": "20Gi", "compute": "30"})],
        capacity={"memory": "20Gi", "compute": "30"},
    )
    answer = (await kubelet.prepare(claim))[claim[2]]
    assert answer.error == ""
    assert answer.devices[0].share_id == share
    env = env_of(cdi_spec(driver, claim[2]))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["KALLOT_SHARE_ID"] == share


async def test_opaque_config_sets_mps_limits(
    driver: DraDriver, kubelet: DraKubelet, client: NodeClient
) -> None:
    params = {
        "apiVersion": "gpu.kallot.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
            },
        },
    }
    claim = await make_claim(
        client,
        [result("gpu-1")],
        config=[{"source": "FromClaim", "opaque": {"driver": dra.DRIVER, "parameters": params}}],
    )
    answer = (await kubelet.prepare(claim))[claim[2]]
    assert answer.error == ""
    env = env_of(cdi_spec(driver, claim[2]))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


async def test_bad_claims_get_per_claim_errors_while_good_ones_are_served(
    sockdir: Path, driver: DraDriver, kubelet: DraKubelet, client: NodeClient
) -> None:
    good = await make_claim(client, [result("gpu-1")])
    elsewhere = await make_claim(client, [result("gpu-1", pool="other-node")])
    unknown = await make_claim(client, [result("gpu-9")])
    bad_config = await make_claim(
        client,
        [result("gpu-1")],
        config=[
            {
                "source": "FromClaim",
                "opaque": {
                    "driver": dra.DRIVER,
                    "parameters": {
                        "apiVersion": "gpu.kallot.io/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "Sometimes"},
                    },
                },
            }
        ],
    )
    answers = await kubelet.prepare(good, elsewhere, unknown, bad_config)
    assert answers[good[2]].error == ""
    assert answers[good[2]].devices[0].device_name == "gpu-1"
    err = answers[elsewhere[2]].error
    assert "pool 'other-node'" in err and f"expected pool '{NODE}'" in err
    err = answers[unknown[2]].error
    assert "device: got 'gpu-9', expected a device this node publishes" in err
    err = answers[bad_config[2]].error
    assert "opaque.parameters.sharing.strategy: got Sometimes, expected" in err, err
    assert "'MPS' or 'TimeSlicing'" in err
    assert "Traceback" not in err
    # none of the refused claims left anything behind
    assert set(driver.checkpoint.claims) == {good[2]}


async def test_unwritable_cdi_dir_is_a_per_claim_error_and_creates_nothing(
    sockdir: Path, fake: FakeBackend, client: NodeClient
) -> None:
    blocker = sockdir / "not-a-dir"
    blocker.write_text("")
    config = _config(sockdir, cdi_dir=blocker / "cdi")
    d = DraDriver(config, _inventory(fake), ApiClaimSource(client), fake)
    await d.start()
    k = DraKubelet(config.registry_dir)
    try:
        await k.register(dra.DRIVER)
        claim = await make_claim(client, [result("gpu-0-mig-1g10gb-3")])
        err = (await k.prepare(claim))[claim[2]].error
        assert "writing the CDI spec" in err and "--cdi-dir" in err
        assert fake.mig_layout(0) == []  # the instance it created is gone again
        assert d.checkpoint.claims == {}
    finally:
        await k.close()
        await d.stop()


async def test_dynamic_mig_created_at_prepare_and_destroyed_by_a_restarted_agent(
    sockdir: Path, fake: FakeBackend, client: NodeClient
) -> None:
    config = _config(sockdir)
    d = DraDriver(config, _inventory(fake), ApiClaimSource(client), fake)
    await d.start()
    k = DraKubelet(config.registry_dir)
    await k.register(dra.DRIVER)
    claim = await make_claim(client, [result("gpu-0-mig-2g20gb-2")])
    answer = (await k.prepare(claim))[claim[2]]
    assert answer.error == ""
    assert fake.mig_layout(0) == [("2g.20gb", 2)]
    env = env_of(cdi_spec(d, claim[2]))
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    # the slices stay the same: the created instance is the allocated placement
    before = dra.resource_slices(_inventory(fake), d.options())
    assert before == dra.resource_slices(
        build_inventory(FakeBackend.from_file(DATA / "dra-a100-3.yaml").raw(), fake.sharing()),
        d.options(),
    )
    # the agent dies: its servers go, nothing is unprepared, nothing in memory survives
    await k.close()
    await d.stop()
    del d
    d2 = DraDriver(config, _inventory(fake), ApiClaimSource(client), fake)
    await d2.start()
    k2 = DraKubelet(config.registry_dir)
    try:
        await k2.register(dra.DRIVER)
        again = (await k2.prepare(claim))[claim[2]]
        assert again.SerializeToString(deterministic=True) == answer.SerializeToString(
            deterministic=True
        )
        assert fake.mig_calls.count(("create", 0, "2g.20gb", 2)) == 1
        assert (await k2.unprepare(claim))[claim[2]].error == ""
        assert fake.mig_layout(0) == []
        assert ("destroy", 0, "", 2) in fake.mig_calls
        assert not list(config.cdi_dir.glob("*.json"))
    finally:
        await k2.close()
        await d2.stop()


async def test_a_placement_nvml_refuses_is_a_per_claim_error(
    driver: DraDriver, kubelet: DraKubelet, client: NodeClient, fake: FakeBackend
) -> None:
    first = await make_claim(client, [result("gpu-0-mig-4g40gb-0")])
    overlapping = await make_claim(client, [result("gpu-0-mig-3g40gb-0")])
    answers = await kubelet.prepare(first, overlapping)
    assert answers[first[2]].error == ""
    assert "overlaps" in answers[overlapping[2]].error
    assert core_mig.valid_layout("A100-80GB", fake.mig_layout(0)) == ""
    assert fake.mig_layout(0) == [("4g.40gb", 0)]


@pytest.mark.parametrize(("version", "api"), [("v1alpha1", hpb_alpha), ("v1", hpb)])
async def test_health_changes_reach_the_stream(
    driver: DraDriver, kubelet: DraKubelet, fake: FakeBackend, version: str, api: Any
) -> None:
    # Both package names the kubelet may call: v1alpha1 (1.34-1.36), v1 (1.37 on).
    stream = kubelet.watch_health(version)
    first = await stream.read()
    health = {d.device.device_name: (d.health, d.message) for d in first.devices}
    assert health["gpu-1"] == (api.HEALTHY, "")
    assert all(d.device.pool_name == NODE for d in first.devices)
    assert len(health) == len(driver.devices())
    sick = "GPU-5a3c9f1e-0401-4e4e-8a55-000000000000"
    await driver.update(unhealthy={sick})
    change = await stream.read()
    assert [(d.device.device_name, d.health) for d in change.devices] == [("gpu-1", api.UNHEALTHY)]
    assert f"GPU {sick} is unhealthy" in change.devices[0].message
    await driver.update(unhealthy=set())
    change = await stream.read()
    assert [(d.device.device_name, d.health, d.message) for d in change.devices] == [
        ("gpu-1", api.HEALTHY, "")
    ]
    stream.cancel()


async def test_agent_in_dra_mode_publishes_slices_and_taints_an_unhealthy_gpu(
    sockdir: Path, fake: FakeBackend, client: NodeClient
) -> None:
    from kallot.node.agent import Agent, AgentConfig
    from kallot.node.deviceplugin import StaticRecordSource
    from kallot.node.dra_api import SLICES, SlicePublisher

    node = f"agent-{uuid.uuid4().hex[:6]}"
    config = AgentConfig(
        node=node,
        plugin_dir=sockdir / "device-plugins",
        pod_resources_socket=sockdir / "none.sock",
        sharing=fake.sharing(),
        dra=DraConfig(
            node=node,
            registry_dir=sockdir / "plugins_registry",
            plugins_dir=sockdir / "plugins",
            cdi_dir=sockdir / "cdi",
        ),
        device_plugin=False,
    )
    slices = SlicePublisher(client, node)
    agent = Agent(
        config,
        fake,
        StaticRecordSource(),
        claims=ApiClaimSource(client),
        slices=slices,
    )

    async def pool() -> list[dict[str, Any]]:
        items = (await client.request("GET", SLICES))["items"]
        return [s for s in items if s["spec"]["pool"]["name"] == node]

    await agent.start(serve_metrics=False)
    kubelet = DraKubelet(sockdir / "plugins_registry")
    try:
        assert agent.devices.resources() == []  # DRA only: no device plugin resource
        assert not (sockdir / "device-plugins").exists()
        first = await pool()
        assert {s["spec"]["pool"]["generation"] for s in first} == {1}
        await agent.refresh()  # nothing changed: nothing written
        assert slices.applied == len(first)
        await kubelet.register(dra.DRIVER)
        stream = kubelet.watch_health()
        await stream.read()
        sick = "GPU-5a3c9f1e-0401-4e4e-8a55-000000000000"
        await agent.handle_xids([XidEvent(uuid=sick, xid=79)])
        now = await pool()
        assert {s["spec"]["pool"]["generation"] for s in now} == {2}
        tainted = [
            d["name"] for s in now for d in s["spec"].get("devices") or [] if d.get("taints")
        ]
        assert tainted == ["gpu-1"]
        change = await stream.read()
        assert [(d.device.device_name, d.health) for d in change.devices] == [
            ("gpu-1", hpb.UNHEALTHY)
        ]
        # The kubelet shows the message in the pod's status: the XID says why.
        assert f"GPU {sick} is unhealthy (XID 79: " in change.devices[0].message
        stream.cancel()
    finally:
        await kubelet.close()
        await agent.stop()


async def test_agent_with_both_splits_the_gpus(
    sockdir: Path, fake: FakeBackend, client: NodeClient
) -> None:
    from kallot.node.agent import Agent, AgentConfig
    from kallot.node.allocate import RESOURCE_GPU
    from kallot.node.deviceplugin import StaticRecordSource

    config = AgentConfig(
        node=NODE,
        plugin_dir=sockdir,
        sharing=fake.sharing(),
        dra=DraConfig(
            node=NODE,
            registry_dir=sockdir / "plugins_registry",
            plugins_dir=sockdir / "plugins",
            cdi_dir=sockdir / "cdi",
            gpus=frozenset({0, 2}),
        ),
        device_plugin=True,
    )
    agent = Agent(config, fake, StaticRecordSource(), claims=ApiClaimSource(client))
    assert agent.dra is not None
    assert {d.gpu.index for d in agent.dra.devices().values()} == {0, 2}
    assert [d.uuid for d in agent.devices.of(RESOURCE_GPU)] == [
        "GPU-5a3c9f1e-0401-4e4e-8a55-000000000000"
    ]


async def test_agent_process_killed_between_prepare_and_unprepare(
    sockdir: Path, client: NodeClient, node_cp: Any
) -> None:
    """The real `kallot agent run --dra` process, SIGKILLed after prepare: a new process
    unprepares the claim (CDI spec removed, checkpoint emptied)."""
    import os
    import signal
    import subprocess
    import sys

    registry = sockdir / "plugins_registry"

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kallot.cli.main",
                "agent",
                "run",
                "--dra",
                "--node-name",
                NODE,
                "--inventory-file",
                str(DATA / "dra-a100-3.yaml"),
                "--kubeconfig",
                str(node_cp.kubeconfig_path),
                "--kubelet-plugins-dir",
                str(sockdir / "plugins"),
                "--kubelet-registry-dir",
                str(registry),
                "--cdi-dir",
                str(sockdir / "cdi"),
                "--metrics-address",
                "127.0.0.1:0",
                "--pod-resources-socket",
                str(sockdir / "none.sock"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    async def registered(proc: subprocess.Popen[bytes]) -> DraKubelet:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        sock = registry / "gpu.kallot.io-reg.sock"
        while not sock.is_socket():  # the process serves it once started
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert loop.time() < deadline, "the agent did not start"
            await asyncio.sleep(0.1)
        k = DraKubelet(registry)
        await k.register(dra.DRIVER)
        return k

    claim = await make_claim(client, [result("gpu-1")])
    first = start()
    try:
        k = await registered(first)
        answer = (await k.prepare(claim))[claim[2]]
        await k.close()
        assert answer.error == ""
        assert list((sockdir / "cdi").glob(f"*{claim[2]}*"))
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    (registry / "gpu.kallot.io-reg.sock").unlink()  # what a dead process leaves is not a server
    second = start()
    try:
        k = await registered(second)
        assert (await k.unprepare(claim))[claim[2]].error == ""
        await k.close()
        assert not list((sockdir / "cdi").glob("*.json"))
        doc = json.loads((sockdir / "plugins" / "gpu.kallot.io" / "checkpoint.json").read_text())
        assert doc["claims"] == {}
    finally:
        second.terminate()
        second.wait(timeout=30)


@pytest.fixture(scope="module")
def cdi_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tools/testenv/cdi built with Go: the container runtimes' CDI library
    (tags.cncf.io/container-device-interface) reading a spec directory."""
    go = shutil.which("go")
    assert go, "go: not on PATH (the test suite builds its Go parts with it)"
    out = tmp_path_factory.mktemp("cdi") / "cdi-check"
    src = Path(__file__).resolve().parents[2] / "tools" / "testenv" / "cdi"
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    subprocess.run([go, "build", "-o", str(out), "."], cwd=src, env=env, check=True, timeout=600)
    return out


async def test_the_cdi_specs_are_what_the_runtimes_cdi_library_accepts(
    sockdir: Path, fake: FakeBackend, client: NodeClient, cdi_check: Path
) -> None:
    # containerd and CRI-O resolve the IDs prepare returns with this library before a container
    # starts; a spec it refuses fails the pod at container creation, long after scheduling.
    config = dataclasses.replace(_config(sockdir), mps_pipe_dir="/run/nvidia/mps")
    d = DraDriver(config, _inventory(fake), ApiClaimSource(client), fake)
    await d.start()
    k = DraKubelet(config.registry_dir)
    try:
        await k.register(dra.DRIVER)
        share = str(uuid.uuid4())
        claims = {
            "whole": await make_claim(client, [result("gpu-1")]),
            "mps": await make_claim(
                client,
                [result("gpu-2", shareID=share, consumedCapacity={"memory": "20Gi"})],
                capacity={"memory": "20Gi"},
            ),
            "mig": await make_claim(client, [result("gpu-0-mig-2g20gb-2")]),
            "two": await make_claim(
                client,
                [result("gpu-1", request="a"), result("gpu-2", request="b")],
                requests=("a", "b"),
            ),
        }
        answers = await k.prepare(*claims.values())
        ids = {
            kind: [i for dev in answers[c[2]].devices for i in dev.cdi_device_ids]
            for kind, c in claims.items()
        }
        assert all(answers[c[2]].error == "" for c in claims.values())
        every = [i for got in ids.values() for i in got]
        unknown = f"{CDI_KIND}=no-such-device"
        run = subprocess.run(
            [str(cdi_check), str(config.cdi_dir), *every, unknown],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        report = json.loads(run.stdout)
        assert report["errors"] == {}
        assert report["devices"][unknown] == {"found": False}
        devices = {i: report["devices"][i] for i in every}
        assert all(v["found"] and "error" not in v for v in devices.values()), devices

        def env(kind: str) -> dict[str, str]:
            out: dict[str, str] = {}
            for i in ids[kind]:
                out.update(e.split("=", 1) for e in devices[i]["env"])
            return out

        gpu1 = "GPU-5a3c9f1e-0401-4e4e-8a55-000000000000"
        assert env("whole")["NVIDIA_VISIBLE_DEVICES"] == gpu1
        assert "/dev/nvidia1" in devices[ids["whole"][0]]["deviceNodes"]
        assert env("mps")["KALLOT_SHARE_ID"] == share
        assert env("mps")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert "/run/nvidia/mps:/run/nvidia/mps" in devices[ids["mps"][0]]["mounts"]
        assert env("mig")["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        assert len(ids["two"]) == 2
        assert [devices[i]["deviceNodes"][0] for i in ids["two"]] == [
            "/dev/nvidia1",
            "/dev/nvidia2",
        ]
    finally:
        await k.close()
        await d.stop()
