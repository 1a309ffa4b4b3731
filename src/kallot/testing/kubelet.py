"""A kubelet-side harness for the device plugin tests: the kubelet's half of API v1beta1 over real
unix sockets, generated from the same protos as the plugin.

``FakePodResources`` serves the kubelet's pod-resources ``List``. ``DraKubelet`` is the kubelet's
half of DRA: the plugin watcher's registration (GetInfo, NotifyRegistrationStatus) on a
``plugins_registry`` socket, then NodePrepareResources / NodeUnprepareResources /
NodeWatchResources on the endpoint the plugin named. ``FakeKubelet`` serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``, records every
RegisterRequest and, as the kubelet does, opens the plugin's ListAndWatch right after it; ``restart()`` does what a kubelet restart does to the directory (stop serving,
remove kubelet.sock and the plugin sockets, serve a new kubelet.sock). ``PluginClient`` calls a
plugin's socket as the kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

from grpc import aio

from kallot.node.proto import deviceplugin_v1beta1_pb2 as pb
from kallot.node.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from kallot.node.proto import dra_health_v1_pb2 as pb_health
from kallot.node.proto import dra_health_v1_pb2_grpc as pb_grpc_health
from kallot.node.proto import dra_health_v1alpha1_pb2 as pb_health_alpha
from kallot.node.proto import dra_health_v1alpha1_pb2_grpc as pb_grpc_health_alpha
from kallot.node.proto import dra_v1_pb2 as pb_dra
from kallot.node.proto import dra_v1_pb2_grpc as pb_grpc_dra
from kallot.node.proto import pluginregistration_v1_pb2 as pb_reg
from kallot.node.proto import pluginregistration_v1_pb2_grpc as pb_grpc_reg
from kallot.node.proto import podresources_v1_pb2 as pb_pr
from kallot.node.proto import podresources_v1_pb2_grpc as pb_grpc_pr

# The generated *_pb2_grpc modules are untyped (grpcio-tools writes no annotations), so each call
# into them carries a narrow ``no-untyped-call`` ignore, as in kallot.node.


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(  # noqa: N802 - the gRPC method name
        self, request: pb.RegisterRequest, context: Any
    ) -> pb.Empty:
        self.kubelet.requests.append(request)
        self.kubelet.watch(request)
        await self.kubelet.registered.put(request)
        return pb.Empty()


class _UnixServer:
    """One gRPC server on a unix socket; subclasses add their servicer in ``_serve``."""

    socket: Path
    _server: aio.Server | None = None

    def _serve(self, server: aio.Server) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        server = aio.server()
        self._serve(server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()


class FakeKubelet(_UnixServer):
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.socket = directory / "kubelet.sock"
        self.requests: list[pb.RegisterRequest] = []
        self.registered: asyncio.Queue[pb.RegisterRequest] = asyncio.Queue()
        #: resource -> the device IDs of the last list its ListAndWatch sent (as the kubelet
        #: opens ListAndWatch right after a registration and keeps it open)
        self.devices: dict[str, list[str]] = {}
        self.lists: Counter[str] = Counter()  # lists received per resource
        self._watches: dict[str, asyncio.Task[None]] = {}

    def _serve(self, server: aio.Server) -> None:
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]

    def watch(self, request: pb.RegisterRequest) -> None:
        old = self._watches.pop(request.resource_name, None)
        if old is not None:
            old.cancel()
        self._watches[request.resource_name] = asyncio.create_task(
            self._list_and_watch(request.resource_name, request.endpoint)
        )

    async def _list_and_watch(self, resource: str, endpoint: str) -> None:
        client = PluginClient(self.dir, endpoint)
        try:
            async for resp in client.list_and_watch():
                self.devices[resource] = [d.ID for d in resp.devices]
                self.lists[resource] += 1
        except aio.AioRpcError:  # the plugin went away; its next registration watches again
            pass
        finally:
            await client.close()

    async def stop(self) -> None:
        for task in self._watches.values():
            task.cancel()
        for task in self._watches.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watches.clear()
        await super().stop()

    async def restart(self, *, delete_plugin_sockets: bool = True) -> None:
        """Stop, delete kubelet.sock and every plugin socket (as the kubelet does), start again.
        ``delete_plugin_sockets=False`` recreates only kubelet.sock: on ext4 the new socket gets
        the old inode number, the restart a watch comparing inode numbers would miss."""
        await self.stop()
        if delete_plugin_sockets:
            for path in self.dir.glob("*.sock"):
                path.unlink()
        await self.start()

    async def next_registration(self, timeout: float = 10.0) -> pb.RegisterRequest:
        return await asyncio.wait_for(self.registered.get(), timeout)


class PluginClient:
    """The kubelet's calls to one plugin socket."""

    def __init__(self, directory: Path, endpoint: str) -> None:
        self.channel = aio.insecure_channel(f"unix://{directory / endpoint}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self.channel.close()

    async def options(self) -> pb.DevicePluginOptions:
        resp: pb.DevicePluginOptions = await self.stub.GetDevicePluginOptions(
            pb.Empty(), timeout=10
        )
        return resp

    def list_and_watch(self) -> Any:
        return self.stub.ListAndWatch(pb.Empty())

    async def allocate(self, *containers: list[str]) -> pb.AllocateResponse:
        req = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        )
        resp: pb.AllocateResponse = await self.stub.Allocate(req, timeout=10)
        return resp

    async def preferred(
        self, available: list[str], size: int, must_include: list[str] | None = None
    ) -> list[str]:
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include or [],
                    allocation_size=size,
                )
            ]
        )
        resp = await self.stub.GetPreferredAllocation(req, timeout=10)
        return list(resp.container_responses[0].deviceIDs)


class _Lister(pb_grpc_pr.PodResourcesListerServicer):
    def __init__(self, owner: FakePodResources) -> None:
        self.owner = owner

    async def List(  # noqa: N802 - the gRPC method name
        self, request: pb_pr.ListPodResourcesRequest, context: Any
    ) -> pb_pr.ListPodResourcesResponse:
        return pb_pr.ListPodResourcesResponse(
            pod_resources=[
                pb_pr.PodResources(
                    namespace=ns,
                    name=name,
                    containers=[
                        pb_pr.ContainerResources(
                            name=cname,
                            devices=[
                                pb_pr.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in devices.items()
                            ],
                        )
                        for cname, devices in containers.items()
                    ],
                )
                for (ns, name), containers in self.owner.pods.items()
            ]
        )


class FakePodResources(_UnixServer):
    """The kubelet's pod-resources API on ``socket``: ``pods[(ns, name)][container][resource]``
    holds the device IDs the test says the kubelet assigned."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}

    def _serve(self, server: aio.Server) -> None:
        pb_grpc_pr.add_PodResourcesListerServicer_to_server(_Lister(self), server)  # type: ignore[no-untyped-call]


class DraKubelet:
    """The kubelet's calls to a DRA plugin: ``register`` does what the plugin watcher does with
    a socket that appears in ``registry_dir`` (GetInfo, check type and version, connect to the
    endpoint, NotifyRegistrationStatus); then ``prepare`` / ``unprepare`` / ``watch_health``."""

    VERSION = "v1.DRAPlugin"

    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir
        self.info: pb_reg.PluginInfo | None = None
        self._channels: list[aio.Channel] = []
        self._plugin: pb_grpc_dra.DRAPluginStub | None = None
        self._channel: aio.Channel | None = None

    async def register(self, driver: str) -> pb_reg.PluginInfo:
        sock = self.registry_dir / f"{driver}-reg.sock"
        reg = aio.insecure_channel(f"unix://{sock}")
        self._channels.append(reg)
        stub = pb_grpc_reg.RegistrationStub(reg)  # type: ignore[no-untyped-call]
        info: pb_reg.PluginInfo = await stub.GetInfo(pb_reg.InfoRequest(), timeout=10)
        error = ""
        if info.type != "DRAPlugin":
            error = f"type {info.type!r}, expected DRAPlugin"
        elif self.VERSION not in info.supported_versions:
            error = f"versions {list(info.supported_versions)}, expected {self.VERSION}"
        elif info.name != driver:
            error = f"name {info.name!r}, expected {driver!r}"
        await stub.NotifyRegistrationStatus(
            pb_reg.RegistrationStatus(plugin_registered=not error, error=error), timeout=10
        )
        if error:
            raise AssertionError(f"registration refused: {error}")
        channel = aio.insecure_channel(f"unix://{info.endpoint}")
        self._channels.append(channel)
        self._plugin = pb_grpc_dra.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        self._channel = channel
        self.info = info
        return info

    @staticmethod
    def _claims(claims: tuple[tuple[str, str, str], ...]) -> list[pb_dra.Claim]:
        return [pb_dra.Claim(namespace=ns, uid=uid, name=name) for ns, name, uid in claims]

    async def prepare(
        self, *claims: tuple[str, str, str]
    ) -> dict[str, pb_dra.NodePrepareResourceResponse]:
        """NodePrepareResources for (namespace, name, uid) claims; answers by claim UID."""
        assert self._plugin is not None, "register first"
        req = pb_dra.NodePrepareResourcesRequest(claims=self._claims(claims))
        resp = await self._plugin.NodePrepareResources(req, timeout=30)
        return dict(resp.claims)

    async def unprepare(
        self, *claims: tuple[str, str, str]
    ) -> dict[str, pb_dra.NodeUnprepareResourceResponse]:
        assert self._plugin is not None, "register first"
        req = pb_dra.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        resp = await self._plugin.NodeUnprepareResources(req, timeout=30)
        return dict(resp.claims)

    def watch_health(self, version: str = "v1alpha1") -> Any:
        """NodeWatchResources of the health API ``version``: "v1alpha1" (what kubelets
        1.34-1.36 call) or "v1" (1.37 on)."""
        assert self._channel is not None, "register first"
        if version == "v1":
            stub = pb_grpc_health.DRAResourceHealthStub(self._channel)  # type: ignore[no-untyped-call]
            return stub.NodeWatchResources(pb_health.NodeWatchResourcesRequest())
        assert version == "v1alpha1", version
        alpha = pb_grpc_health_alpha.DRAResourceHealthStub(self._channel)  # type: ignore[no-untyped-call]
        return alpha.NodeWatchResources(pb_health_alpha.NodeWatchResourcesRequest())

    async def close(self) -> None:
        for c in self._channels:
            await c.close()
        self._channels = []
