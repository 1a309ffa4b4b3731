"""A kubelet-side harness for the device plugin tests: the kubelet's half of API v1beta1 over real
unix sockets, generated from the same protos as the plugin.

``FakePodResources`` serves the kubelet's pod-resources ``List``. ``FakeKubelet`` serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock`` and records every
RegisterRequest; ``restart()`` does what a kubelet restart does to the directory (stop serving,
remove kubelet.sock and the plugin sockets, serve a new kubelet.sock). ``PluginClient`` calls a
plugin's socket as the kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from grpc import aio

from kallot.node.proto import deviceplugin_v1beta1_pb2 as pb
from kallot.node.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from kallot.node.proto import podresources_v1_pb2 as pb_pr
from kallot.node.proto import podresources_v1_pb2_grpc as pb_grpc_pr


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(  # noqa: N802 - the gRPC method name
        self, request: pb.RegisterRequest, context: Any
    ) -> pb.Empty:
        self.kubelet.requests.append(request)
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

    def _serve(self, server: aio.Server) -> None:
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)

    async def restart(self) -> None:
        """Stop, delete kubelet.sock and every plugin socket (as the kubelet does), start again."""
        await self.stop()
        for path in self.dir.glob("*.sock"):
            path.unlink()
        await self.start()

    async def next_registration(self, timeout: float = 10.0) -> pb.RegisterRequest:
        return await asyncio.wait_for(self.registered.get(), timeout)


class PluginClient:
    """The kubelet's calls to one plugin socket."""

    def __init__(self, directory: Path, endpoint: str) -> None:
        self.channel = aio.insecure_channel(f"unix://{directory / endpoint}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def options(self) -> pb.DevicePluginOptions:
        return await self.stub.GetDevicePluginOptions(pb.Empty(), timeout=10)

    def list_and_watch(self) -> Any:
        return self.stub.ListAndWatch(pb.Empty())

    async def allocate(self, *containers: list[str]) -> pb.AllocateResponse:
        req = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        )
        return await self.stub.Allocate(req, timeout=10)

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
        pb_grpc_pr.add_PodResourcesListerServicer_to_server(_Lister(self), server)
