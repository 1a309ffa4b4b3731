"""The device plugin against a kubelet-side harness over real unix sockets (kallot.testing.kubelet)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from kallot.config.device_record import DeviceRecord, RecordDevice, RecordMig
from kallot.config.inventory import NodeInventory
from kallot.node.allocate import RESOURCE_GPU, RESOURCE_MILLI, PodRecord
from kallot.node.deviceplugin import (
    DevicePlugins,
    Devices,
    PluginOptions,
    StaticRecordSource,
    socket_name,
)
from kallot.node.discovery import build_inventory
from kallot.node.fake import FakeBackend
from kallot.testing.kubelet import FakeKubelet, PluginClient

DATA = Path(__file__).parent / "data"
NODE = "gpu-1"


def load(name: str) -> NodeInventory:
    backend = FakeBackend.from_file(DATA / name)
    return build_inventory(backend.raw(), backend.sharing())


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # Unix socket paths are limited to ~108 bytes: keep the directory short.
    d = Path(tempfile.mkdtemp(prefix="kdp-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def kubelet(sockdir: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(sockdir)
    await k.start()
    yield k
    await k.stop()


def whole(inv: NodeInventory, *slots: int, node: str = NODE) -> DeviceRecord:
    return DeviceRecord(
        node=node,
        devices=tuple(
            RecordDevice(
                index=s,
                uuid=inv.devices[s].uuid,
                milli=1000,
                mem_mib=inv.devices[s].mem_mib,
                mode="exclusive",
            )
            for s in slots
        ),
    )


def share(inv: NodeInventory, slot: int, milli: int, mem_mib: int) -> DeviceRecord:
    d = inv.devices[slot]
    return DeviceRecord(
        node=NODE,
        devices=(RecordDevice(index=slot, uuid=d.uuid, milli=milli, mem_mib=mem_mib, mode=d.mode),),
    )


def pod(name: str, record: DeviceRecord | None, *, bind_time: int = 1) -> PodRecord:
    return PodRecord(
        namespace="ml", name=name, uid=f"uid-{name}", record=record, bind_time=bind_time
    )


async def start(
    sockdir: Path, inv: NodeInventory, source: StaticRecordSource
) -> tuple[Devices, DevicePlugins]:
    devices = Devices(inv)
    plugins = DevicePlugins(devices, source, PluginOptions(node=NODE, plugin_dir=sockdir))
    await plugins.start()
    return devices, plugins


async def test_registers_each_resource_on_its_own_socket(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("hgx-h100-8.yaml")
    _, plugins = await start(sockdir, inv, StaticRecordSource())
    try:
        got = {}
        for _ in range(2):
            req = await kubelet.next_registration()
            got[req.resource_name] = req
        assert set(got) == {RESOURCE_GPU, RESOURCE_MILLI}
        for resource, req in got.items():
            assert req.version == "v1beta1"
            assert req.endpoint == socket_name(resource)
            assert (sockdir / req.endpoint).is_socket()
            assert req.options.get_preferred_allocation_available
        client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
        opts = await client.options()
        assert opts.get_preferred_allocation_available and not opts.pre_start_required
        await client.close()
    finally:
        await plugins.stop()


async def test_list_and_watch_streams_health_changes(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("hgx-h100-8.yaml")
    devices, plugins = await start(sockdir, inv, StaticRecordSource())
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        stream = client.list_and_watch()
        first = await asyncio.wait_for(stream.read(), 10)
        assert [d.ID for d in first.devices] == [d.uuid for d in inv.devices]
        assert {d.health for d in first.devices} == {"Healthy"}
        assert [d.topology.nodes[0].ID for d in first.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
        sick = inv.devices[3].uuid
        await devices.update(unhealthy={sick})
        second = await asyncio.wait_for(stream.read(), 10)
        health = {d.ID: d.health for d in second.devices}
        assert health[sick] == "Unhealthy"
        assert sum(h == "Healthy" for h in health.values()) == 7
        await devices.update(unhealthy=set())
        third = await asyncio.wait_for(stream.read(), 10)
        assert {d.health for d in third.devices} == {"Healthy"}
        # The milli resource of the same GPU follows (1000 IDs per MPS GPU).
        milli = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
        m = await asyncio.wait_for(milli.list_and_watch().read(), 10)
        assert len(m.devices) == 8000
        await milli.close()
        stream.cancel()
    finally:
        await client.close()
        await plugins.stop()


async def test_allocate_whole_gpus_from_the_record(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("hgx-h100-8.yaml")
    source = StaticRecordSource([pod("train", whole(inv, 4, 5))])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        all_ids = [d.uuid for d in inv.devices]
        # The kubelet asks for a preference: the recorded GPUs, not the best free pair 0,1.
        assert await client.preferred(all_ids, 2) == [inv.devices[4].uuid, inv.devices[5].uuid]
        resp = await client.allocate([inv.devices[4].uuid, inv.devices[5].uuid])
        (c,) = resp.container_responses
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == f"{inv.devices[4].uuid},{inv.devices[5].uuid}"
        assert [d.name for d in c.cdi_devices] == [
            f"nvidia.com/gpu={inv.devices[4].uuid}",
            f"nvidia.com/gpu={inv.devices[5].uuid}",
        ]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in c.envs
        assert source.allocated == ["ml/train"]
    finally:
        await client.close()
        await plugins.stop()


async def test_preferred_allocation_without_record_uses_topology(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("pcie-l40s-8.yaml")
    _, plugins = await start(sockdir, inv, StaticRecordSource())
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        ids = [d.uuid for d in inv.devices]
        # Free: 1, 2, 3 and 6: the best pair is 2-3 on one PCIe switch (PIX).
        got = await client.preferred([ids[1], ids[2], ids[3], ids[6]], 2)
        assert got == [ids[2], ids[3]]
    finally:
        await client.close()
        await plugins.stop()


async def test_allocate_mps_share_sets_limits(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("hgx-h100-8.yaml")
    source = StaticRecordSource([pod("notebook", share(inv, 2, 250, 20480))])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
    try:
        available = [f"{d.uuid}::{k}" for d in inv.devices for k in range(1000)]
        chosen = await client.preferred(available, 250)
        assert len(chosen) == 250
        assert {c.split("::")[0] for c in chosen} == {inv.devices[2].uuid}
        resp = await client.allocate(chosen)
        envs = resp.container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == inv.devices[2].uuid
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    finally:
        await client.close()
        await plugins.stop()


async def test_allocate_mig_instance(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("mig-a100-mixed.yaml")
    gpu0 = inv.devices[0]
    record = DeviceRecord(
        node=NODE,
        devices=(
            RecordDevice(
                index=0,
                uuid=gpu0.uuid,
                milli=1000,
                mem_mib=40192,
                mode="mig",
                mig=RecordMig(profile="2g.20gb", start=4),
            ),
        ),
    )
    source = StaticRecordSource([pod("serve", record)])
    _, plugins = await start(sockdir, inv, source)
    try:
        resources = set()
        for _ in range(5):
            resources.add((await kubelet.next_registration()).resource_name)
        assert resources == {
            RESOURCE_GPU,
            RESOURCE_MILLI,  # the MIG instances' milli-GPUs, for shares placed on them
            "nvidia.com/mig-3g.40gb",
            "nvidia.com/mig-2g.20gb",
            "nvidia.com/mig-1g.10gb",
        }
        client = PluginClient(sockdir, socket_name("nvidia.com/mig-2g.20gb"))
        listed = await asyncio.wait_for(client.list_and_watch().read(), 10)
        mig_uuid = gpu0.mig[1].uuid
        assert [d.ID for d in listed.devices] == [mig_uuid]
        resp = await client.allocate([mig_uuid])
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        await client.close()
    finally:
        await plugins.stop()


async def test_allocate_without_record_is_refused(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("hgx-h100-8.yaml")
    # One pod has a record for other GPUs, one has none: neither explains the request.
    source = StaticRecordSource([pod("other", whole(inv, 0)), pod("bare", None)])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.allocate([inv.devices[6].uuid])
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        msg = info.value.details() or ""
        assert "no device record on node gpu-1 asks 1 x nvidia.com/gpu" in msg
        assert inv.devices[6].uuid in msg and "ml/other" in msg
        assert source.allocated == []
    finally:
        await client.close()
        await plugins.stop()


async def test_allocate_record_for_another_node_is_refused(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("hgx-h100-8.yaml")
    source = StaticRecordSource([pod("moved", whole(inv, 1, node="gpu-9"))])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.allocate([inv.devices[1].uuid])
        assert "is for node 'gpu-9', this is node 'gpu-1'" in (info.value.details() or "")
    finally:
        await client.close()
        await plugins.stop()


async def test_allocate_unhealthy_device_is_refused(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("hgx-h100-8.yaml")
    source = StaticRecordSource([pod("train", whole(inv, 1))])
    devices, plugins = await start(sockdir, inv, source)
    await devices.update(unhealthy={inv.devices[1].uuid})
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.allocate([inv.devices[1].uuid])
        assert "Unhealthy" in (info.value.details() or "")
    finally:
        await client.close()
        await plugins.stop()


async def test_kubelet_restart_leads_to_reregistration(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("mig-a100-mixed.yaml")
    source = StaticRecordSource([pod("a", whole(inv, 1))])
    _, plugins = await start(sockdir, inv, source)
    watcher = asyncio.create_task(plugins.watch(0.02))
    try:
        first = {(await kubelet.next_registration()).resource_name for _ in range(5)}
        await kubelet.restart()  # removes kubelet.sock and every plugin socket
        again = {(await kubelet.next_registration()).resource_name for _ in range(5)}
        assert again == first
        # The plugin serves again on its (recreated) socket.
        client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
        resp = await client.allocate([inv.devices[1].uuid])
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == inv.devices[1].uuid
        await client.close()
    finally:
        watcher.cancel()
        await plugins.stop()


async def test_plugin_restart_keeps_allocations(sockdir: Path, kubelet: FakeKubelet) -> None:
    inv = load("hgx-h100-8.yaml")
    source = StaticRecordSource(
        [pod("a", share(inv, 0, 500, 40000), bind_time=1), pod("b", whole(inv, 3), bind_time=2)]
    )
    _, plugins = await start(sockdir, inv, source)
    ids_a = [f"{inv.devices[0].uuid}::{k}" for k in range(500)]
    client = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
    before = await client.allocate(ids_a)
    await client.close()
    await plugins.stop()
    assert source.allocated == ["ml/a"]

    # A new plugin process: nothing but the records survives.
    _, plugins2 = await start(sockdir, inv, source)
    try:
        for _ in range(4):  # two resources registered by each plugin
            await kubelet.next_registration()
        client = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
        after = await client.allocate(ids_a)  # the kubelet re-admits pod a
        assert dict(after.container_responses[0].envs) == dict(before.container_responses[0].envs)
        await client.close()
        gpu = PluginClient(sockdir, socket_name(RESOURCE_GPU))
        resp = await gpu.allocate([inv.devices[3].uuid])
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == inv.devices[3].uuid
        await gpu.close()
        assert source.allocated == ["ml/a", "ml/b"]
    finally:
        await plugins2.stop()


async def test_multi_container_pod_gets_its_gpus_per_container(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("hgx-h100-8.yaml")
    source = StaticRecordSource([pod("two", whole(inv, 6, 7))])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        ids = [d.uuid for d in inv.devices]
        # Container 1 asks one GPU: steered to one of the pod's.
        first = await client.preferred(ids, 1)
        assert first[0] in (ids[6], ids[7])
        resp = await client.allocate([ids[6]])
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ids[6]
        assert source.allocated == []  # half of the record handed out
        # Container 2: the pod's other GPU.
        assert await client.preferred([i for i in ids if i != ids[6]], 1) == [ids[7]]
        resp = await client.allocate([ids[7]])
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ids[7]
        assert source.allocated == ["ml/two"]
    finally:
        await client.close()
        await plugins.stop()


def share_on_mig(inv: NodeInventory, profile: str, start: int, milli: int) -> DeviceRecord:
    """A share the scheduler placed on GPU 0's MIG instance (core.fit.mig_assignment)."""
    gpu0 = inv.devices[0]
    return DeviceRecord(
        node=NODE,
        devices=(
            RecordDevice(
                index=0,
                uuid=gpu0.uuid,
                milli=milli,
                mem_mib=gpu0.mem_mib * 4 // 8,
                mode="mig",
                mig=RecordMig(profile=profile, start=start),
            ),
        ),
    )


async def test_share_on_a_mig_instance_gets_the_mig_uuid(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("mig-a100-mixed.yaml")
    gpu0 = inv.devices[0]
    mig_uuid = gpu0.mig[0].uuid  # 3g.40gb at start 0
    tenant = PodRecord(
        namespace="ml",
        name="tenant",
        uid="uid-tenant",
        record=share_on_mig(inv, "3g.40gb", 0, 428),
        bind_time=1,
        milli=100,  # the pod asks kallot.io/gpu-milli: 100
    )
    source = StaticRecordSource([tenant])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
    try:
        # ListAndWatch: the MIG GPU's instances as milli-GPUs, 428 + 285 + 142 units.
        listed = await asyncio.wait_for(client.list_and_watch().read(), 10)
        ids = [d.ID for d in listed.devices]
        assert len(ids) == 428 + 285 + 142
        assert {i.rsplit("::", 1)[0] for i in ids} == {m.uuid for m in gpu0.mig}
        assert not any(i.startswith(gpu0.uuid) for i in ids)
        # GetPreferredAllocation steers the kubelet to the recorded instance.
        chosen = await client.preferred(ids, 100)
        assert len(chosen) == 100 and {c.rsplit("::", 1)[0] for c in chosen} == {mig_uuid}
        # Allocate: the MIG instance's own UUID, never the parent GPU's.
        resp = await client.allocate(chosen)
        c = resp.container_responses[0]
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={mig_uuid}"]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in c.envs
        assert c.annotations["kallot.io/pod"] == "ml/tenant"
        assert source.allocated == ["ml/tenant"]  # all its units were handed out
    finally:
        await client.close()
        await plugins.stop()


async def test_share_on_a_missing_mig_instance_is_refused(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("mig-a100-mixed.yaml")
    # The node has 3g.40gb@0, 2g.20gb@4 and 1g.10gb@6; the record names a 3g.40gb at 4.
    ghost = PodRecord(
        namespace="ml",
        name="ghost",
        uid="uid-ghost",
        record=share_on_mig(inv, "3g.40gb", 4, 428),
        milli=100,
    )
    source = StaticRecordSource([ghost])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
    try:
        ids = [f"{inv.devices[0].mig[0].uuid}::{k}" for k in range(100)]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.allocate(ids)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        msg = info.value.details() or ""
        assert "ml/ghost names MIG instance 3g.40gb at start 4 of GPU 0" in msg
        assert "does not have" in msg
        assert source.allocated == []
    finally:
        await client.close()
        await plugins.stop()


async def test_multi_container_share_on_a_mig_instance(sockdir: Path, kubelet: FakeKubelet) -> None:
    # Two containers ask 60 + 40 milli: the pod's 100 on the 2g.20gb instance, handed out in two
    # Allocate calls (the kubelet allocates per container); allocated after the second.
    inv = load("mig-a100-mixed.yaml")
    mig_uuid = inv.devices[0].mig[1].uuid
    p = PodRecord(
        namespace="ml",
        name="duo",
        uid="uid-duo",
        record=share_on_mig(inv, "2g.20gb", 4, 285),
        milli=100,
    )
    source = StaticRecordSource([p])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_MILLI))
    try:
        listed = await asyncio.wait_for(client.list_and_watch().read(), 10)
        free = [d.ID for d in listed.devices]
        for size in (60, 40):
            chosen = await client.preferred(free, size)
            assert {c.rsplit("::", 1)[0] for c in chosen} == {mig_uuid} and len(chosen) == size
            resp = await client.allocate(chosen)
            assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
            assert source.allocated == ([] if size == 60 else ["ml/duo"])
            free = [f for f in free if f not in chosen]
    finally:
        await client.close()
        await plugins.stop()


async def _restarts(
    sockdir: Path, kubelet: FakeKubelet, *, delete: bool, interval_s: float, inotify: bool
) -> tuple[int, float]:
    """50 kubelet restarts in a row; each must be followed by every resource's registration
    within 5 s. Returns (restarts that reused kubelet.sock's inode, slowest re-registration)."""
    inv = load("hgx-h100-8.yaml")
    devices = Devices(inv)
    plugins = DevicePlugins(
        devices,
        StaticRecordSource(),
        PluginOptions(node=NODE, plugin_dir=sockdir, inotify=inotify),
    )
    await plugins.start()
    resources = set(devices.resources())
    for _ in resources:
        await kubelet.next_registration()
    watcher = asyncio.create_task(plugins.watch(interval_s))
    reused = 0
    slowest = 0.0
    loop = asyncio.get_running_loop()
    try:
        for n in range(50):
            before = (sockdir / "kubelet.sock").stat().st_ino
            await kubelet.restart(delete_plugin_sockets=delete)
            reused += (sockdir / "kubelet.sock").stat().st_ino == before
            t0 = loop.time()
            got: set[str] = set()
            while got != resources:
                req = await kubelet.next_registration(timeout=5.0)
                got.add(req.resource_name)
            slowest = max(slowest, loop.time() - t0)
            assert kubelet.registered.empty(), f"restart {n}: registered more than once"
            # The kubelet reaches every plugin on its socket again.
            for resource in resources:
                client = PluginClient(sockdir, socket_name(resource))
                assert (await client.options()).get_preferred_allocation_available
                await client.close()
    finally:
        watcher.cancel()
        await plugins.stop()
    print(f"delete={delete} inotify={inotify}: {reused}/50 inode reused, slowest {slowest:.3f}s")
    return reused, slowest


@pytest.mark.parametrize("delete", [False, True], ids=["inode-reused", "all-sockets-deleted"])
async def test_fifty_kubelet_restarts_in_a_row(
    sockdir: Path, kubelet: FakeKubelet, delete: bool
) -> None:
    # A 60 s periodic check: only the directory events can re-register within 5 s.
    await _restarts(sockdir, kubelet, delete=delete, interval_s=60.0, inotify=True)


async def test_fifty_kubelet_restarts_without_directory_events(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    # No inotify: the periodic check alone tells a recreated kubelet.sock with a reused inode
    # number by its change time.
    await _restarts(sockdir, kubelet, delete=False, interval_s=0.05, inotify=False)


def _h200_node(sharing: dict[str, object], *, mig_1g: bool = False) -> NodeInventory:
    """8x H200-141GB (the largest model in docs/gpu-models.md) with ``sharing``; ``mig_1g``
    cuts every GPU into seven 1g.18gb instances (the most instances a GPU holds)."""
    import yaml

    from kallot.node.fake import InventoryFile

    doc = yaml.safe_load((DATA / "hgx-h100-8.yaml").read_text())
    doc["sharing"] = sharing
    for i, g in enumerate(doc["gpus"]):
        g.update(name="NVIDIA H200", memoryMiB=143771)
        if mig_1g:
            g["migEnabled"] = True
            g["mig"] = [
                {
                    "name": "1g.18gb",
                    "start": s,
                    "uuid": f"MIG-5a3c9f1e-{i:04d}-4e4e-8a55-00000000000{s}",
                }
                for s in range(7)
            ]
    spec = InventoryFile.model_validate(doc)
    return build_inventory(spec.raw(), spec.sharing_setting(), strict_mig=True)


@pytest.mark.parametrize(
    ("label", "sharing", "mig_1g"),
    [
        ("mps", {"mode": "mps"}, False),
        (
            "time-slicing x4.096 (the cap)",
            {"mode": "time-slicing", "oversubscription": 4.096},
            False,
        ),
        ("7 x 1g.18gb per GPU", {"mode": "exclusive"}, True),
    ],
)
async def test_list_and_watch_messages_of_the_largest_node_stay_under_4mb(
    sockdir: Path, kubelet: FakeKubelet, label: str, sharing: dict[str, object], mig_1g: bool
) -> None:
    from kallot.node.validate import MAX_IDS_PER_RESOURCE

    inv = _h200_node(sharing, mig_1g=mig_1g)
    devices, plugins = await start(sockdir, inv, StaticRecordSource())
    try:
        for resource in devices.resources():
            # The kubelet's client limit (gRPC's default 4 MB receive) is this channel's too:
            # a larger message would fail the read.
            client = PluginClient(sockdir, socket_name(resource))
            stream = client.list_and_watch()
            msg = await asyncio.wait_for(stream.read(), 30)
            size = msg.ByteSize()
            print(f"{label}: {resource}: {len(msg.devices)} IDs, {size} bytes")
            assert len(msg.devices) <= MAX_IDS_PER_RESOURCE
            assert size < 4 * 1024 * 1024 * 0.6  # well under 4 MB
            stream.cancel()
            await client.close()
    finally:
        await plugins.stop()


async def test_list_and_watch_resends_only_changed_resources(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("mig-a100-mixed.yaml")  # GPU 0: 3g + 2g + 1g instances; GPU 1 whole
    devices, plugins = await start(sockdir, inv, StaticRecordSource())
    whole_gpu = inv.devices[1].uuid
    mig3g = inv.devices[0].mig[0].uuid
    gpu = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    mig = PluginClient(sockdir, socket_name("nvidia.com/mig-3g.40gb"))
    try:
        gpu_stream, mig_stream = gpu.list_and_watch(), mig.list_and_watch()
        assert [d.health for d in (await asyncio.wait_for(gpu_stream.read(), 10)).devices] == [
            "Healthy"
        ]
        assert [d.health for d in (await asyncio.wait_for(mig_stream.read(), 10)).devices] == [
            "Healthy"
        ]
        # 1: the whole GPU fails: only nvidia.com/gpu is re-sent.
        await devices.update(unhealthy={whole_gpu})
        msg = await asyncio.wait_for(gpu_stream.read(), 10)
        assert [d.health for d in msg.devices] == ["Unhealthy"]
        # 2: the 3g instance fails: the MIG stream's next message is this one (it got none for
        # change 1), and the GPU stream gets nothing.
        await devices.update(unhealthy={whole_gpu, mig3g})
        msg = await asyncio.wait_for(mig_stream.read(), 10)
        assert [(d.ID, d.health) for d in msg.devices] == [(mig3g, "Unhealthy")]
        # 3: the whole GPU recovers: the GPU stream's next message is this one (none for 2).
        await devices.update(unhealthy={mig3g})
        msg = await asyncio.wait_for(gpu_stream.read(), 10)
        assert [d.health for d in msg.devices] == ["Healthy"]
        # Nothing changed: no resource is re-sent.
        before = devices.version
        await devices.update(unhealthy={mig3g})
        assert devices.version == before
        gpu_stream.cancel()
        mig_stream.cancel()
    finally:
        await gpu.close()
        await mig.close()
        await plugins.stop()


class _LaggingSource(StaticRecordSource):
    """An informer whose cache has not seen the pods yet: only ``fresh`` reads find them."""

    def __init__(self, pods: list[PodRecord]) -> None:
        super().__init__(pods)
        self.fresh_reads = 0

    async def pods(self, *, fresh: bool = False) -> list[PodRecord]:
        if not fresh:
            return []
        self.fresh_reads += 1
        return await super().pods()


async def test_a_lagging_cache_falls_back_to_a_fresh_read(
    sockdir: Path, kubelet: FakeKubelet
) -> None:
    inv = load("hgx-h100-8.yaml")
    source = _LaggingSource([pod("a", whole(inv, 5, 6))])
    _, plugins = await start(sockdir, inv, source)
    client = PluginClient(sockdir, socket_name(RESOURCE_GPU))
    try:
        ids = await client.preferred([d.uuid for d in inv.devices], 2)
        assert ids == [inv.devices[5].uuid, inv.devices[6].uuid]  # the record's, not topology's
        resp = await client.allocate(ids)
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
        assert source.fresh_reads == 2
    finally:
        await client.close()
        await plugins.stop()
