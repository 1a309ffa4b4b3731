"""The kubelet device plugin (API v1beta1) on ``grpc.aio``: one server per resource.

Each resource (``nvidia.com/gpu``, ``kallot.io/gpu-milli``, ``nvidia.com/mig-<profile>``) gets
its own socket in the device plugin directory and its own registration with the kubelet
(``kubelet.sock`` in the same directory). The kubelet deletes plugin sockets when it restarts
and expects plugins to register again. ``DevicePlugins.watch`` learns of a restart the way the
kubelet's own plugin watcher learns of sockets, from directory events (``dirwatch``, inotify): a
``kubelet.sock`` created or moved in means a new kubelet, a deleted socket of ours means serve
again. An inode number alone cannot tell (ext4 gives a recreated ``kubelet.sock`` the same
number), so a periodic check backs the events up with the socket's full identity (device, inode
and change time in nanoseconds), and a failed registration is retried with a short backoff until
the kubelet answers.

Allocations are not state of the plugin: Allocate derives them from the pods' device records
(``allocate.find_record``), so a restarted plugin answers exactly as before.

Long module: the five RPCs of the device plugin service, the per-resource servers and the
registration and restart watch share one lifecycle (a server is only registered while it serves,
and a kubelet restart re-serves and re-registers all of them); split, each half would need the
other's internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc import aio

from kallot.config import wire
from kallot.config.inventory import NodeInventory
from kallot.node import allocate, kubelet_checkpoint
from kallot.node.allocate import AdvertisedDevice, AllocationError, PodRecord
from kallot.node.dirwatch import IN_CREATE, IN_MOVED_TO, DirWatch
from kallot.node.proto import deviceplugin_v1beta1_pb2 as pb
from kallot.node.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEFAULT_DIR = "/var/lib/kubelet/device-plugins"


class RecordSource(Protocol):
    """Where Allocate reads device records: the pods bound to this node that have not finished.
    The live agent reads them from the API server (``k8s.ApiRecordSource``); tests can use a
    fixed list (``StaticRecordSource``)."""

    async def pods(self, *, fresh: bool = False) -> list[PodRecord]:
        """The pods; ``fresh``: read from the source itself, not a cache that may lag."""
        ...

    async def mark_allocated(self, pod: PodRecord) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StaticRecordSource:
    """Records held in memory (tests and ``--no-kube`` runs); ``mark_allocated`` flips the flag."""

    def __init__(self, pods: Sequence[PodRecord] = ()) -> None:
        self._pods = {p.key: p for p in pods}
        self.allocated: list[str] = []

    def put(self, pod: PodRecord) -> None:
        self._pods[pod.key] = pod

    async def pods(self, *, fresh: bool = False) -> list[PodRecord]:
        return list(self._pods.values())

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def mark_allocated(self, pod: PodRecord) -> None:
        from dataclasses import replace

        self._pods[pod.key] = replace(pod, allocated=True)
        self.allocated.append(pod.key)


AllocationHook = Callable[[str, PodRecord | None, str], Awaitable[None]]


@dataclass
class PluginOptions:
    node: str
    plugin_dir: Path
    cdi_kind: str = wire.CDI_KIND_GPU
    mps_pipe_dir: str = ""
    register_timeout_s: float = 5.0
    inotify: bool = True  # directory events; False leaves the periodic check alone (tests)


class Devices:
    """The advertised devices per resource and a change counter per resource that ListAndWatch
    waits on: an update re-sends only the resources whose devices changed."""

    def __init__(self, inv: NodeInventory) -> None:
        self.inv = inv
        self.unhealthy: set[str] = set()
        self._by_resource = allocate.advertised(inv)
        self.version = 0  # any change
        self._versions: dict[str, int] = {}  # resource -> changes of its devices
        self._changed = asyncio.Condition()

    def resources(self) -> list[str]:
        return sorted(self._by_resource)

    def of(self, resource: str) -> list[AdvertisedDevice]:
        return self._by_resource.get(resource, [])

    def version_of(self, resource: str) -> int:
        return self._versions.get(resource, 0)

    async def update(
        self, inv: NodeInventory | None = None, unhealthy: set[str] | None = None
    ) -> None:
        if inv is not None:
            self.inv = inv
        if unhealthy is not None:
            self.unhealthy = set(unhealthy)
        old = self._by_resource
        self._by_resource = allocate.advertised(self.inv, self.unhealthy)
        changed = [r for r in old.keys() | self._by_resource.keys() if old.get(r) != self.of(r)]
        if not changed:
            return
        async with self._changed:
            self.version += 1
            for r in changed:
                self._versions[r] = self._versions.get(r, 0) + 1
            self._changed.notify_all()

    async def resend(self, resource: str) -> None:
        """ListAndWatch sends ``resource``'s list again, unchanged: the kubelet rewrites its
        device checkpoint on every list (``node.kubelet_checkpoint``)."""
        async with self._changed:
            self.version += 1
            self._versions[resource] = self._versions.get(resource, 0) + 1
            self._changed.notify_all()

    async def wait_change(self, seen: int, resource: str | None = None) -> int:
        """Until the devices (of ``resource``, or any) change from version ``seen``."""
        async with self._changed:
            if resource is None:
                await self._changed.wait_for(lambda: self.version != seen)
                return self.version
            await self._changed.wait_for(lambda: self.version_of(resource) != seen)
            return self.version_of(resource)


def _waiting(pods: Sequence[PodRecord], node: str) -> list[PodRecord]:
    """Pods with a record for ``node`` whose devices were not handed out yet."""
    return [p for p in pods if p.record is not None and p.record.node == node and not p.allocated]


def socket_name(resource: str) -> str:
    """``kallot-nvidia.com-gpu.sock`` for ``nvidia.com/gpu`` (a file name, no slash)."""
    return "kallot-" + re.sub(r"[^A-Za-z0-9._-]", "-", resource) + ".sock"


def _device_pb(d: AdvertisedDevice) -> pb.Device:
    topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa)]) if d.numa >= 0 else None
    return pb.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY, topology=topo)


class _Servicer(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: str,
        devices: Devices,
        source: RecordSource,
        options: PluginOptions,
        *,
        hook: AllocationHook | None,
        stopping: asyncio.Event,
        granted: dict[str, Counter[str]],
        lists: Counter[str],
    ) -> None:
        self.granted = granted
        self.lists = lists
        self.resource = resource
        self.devices = devices
        self.source = source
        self.options = options
        self.hook = hook
        self.stopping = stopping

    async def GetDevicePluginOptions(  # noqa: N802 - the gRPC method name
        self, request: pb.Empty, context: Any
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(  # noqa: N802 - the gRPC method name
        self, request: pb.Empty, context: Any
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        # Only this resource's changes wake the stream: a health change of one GPU re-sends the
        # lists that GPU is in, not every resource's (up to MAX_IDS_PER_RESOURCE IDs each).
        seen = -1
        while not self.stopping.is_set():
            version = self.devices.version_of(self.resource)
            if version != seen:
                seen = version
                yield pb.ListAndWatchResponse(
                    devices=[_device_pb(d) for d in self.devices.of(self.resource)]
                )
                self.lists[self.resource] += 1  # the kubelet took the list (it asks the next)
            waiter = asyncio.ensure_future(self.devices.wait_change(seen, self.resource))
            stop = asyncio.ensure_future(self.stopping.wait())
            try:
                await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for f in (waiter, stop):
                    f.cancel()

    async def GetPreferredAllocation(  # noqa: N802 - the gRPC method name
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        pods = await self.source.pods()
        size = max((int(r.allocation_size) for r in request.container_requests), default=1)
        inv = self.devices.inv
        if not any(
            sum(allocate.pod_footprint(self.resource, p, inv).values()) >= size
            for p in _waiting(pods, self.options.node)
        ):
            # No waiting pod in the (informer's) cache explains this request: the kubelet
            # admitted a pod the watch has not delivered yet. Read the API itself.
            pods = await self.source.pods(fresh=True)
        out = []
        for req in request.container_requests:
            ids = allocate.preferred(
                self.resource,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                int(req.allocation_size),
                pods,
                node=self.options.node,
                inv=self.devices.inv,
            )
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    async def Allocate(  # noqa: N802 - the gRPC method name
        self, request: pb.AllocateRequest, context: Any
    ) -> pb.AllocateResponse:
        pods = await self.source.pods()
        responses = []
        done: dict[str, PodRecord] = {}
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                sick = sorted(
                    {allocate.physical(i) for i in ids}
                    & {d.uuid for d in self.devices.of(self.resource) if not d.healthy}
                )
                if sick:
                    raise AllocationError(f"{self.resource}: devices {sick} are Unhealthy")
                known = {d.id for d in self.devices.of(self.resource)}
                unknown = [i for i in ids if i not in known]
                if unknown:
                    raise AllocationError(
                        f"{self.resource}: unknown device IDs {unknown[:5]} (not advertised)"
                    )
                try:
                    pod = allocate.find_record(
                        self.resource, ids, pods, node=self.options.node, inv=self.devices.inv
                    )
                except AllocationError:  # the cache may lag the kubelet: once from the API
                    pods = await self.source.pods(fresh=True)
                    pod = allocate.find_record(
                        self.resource, ids, pods, node=self.options.node, inv=self.devices.inv
                    )
                g = allocate.grant(
                    self.resource,
                    pod,
                    ids,
                    self.devices.inv,
                    cdi_kind=self.options.cdi_kind,
                    mps_pipe_dir=self.options.mps_pipe_dir,
                )
            except AllocationError as exc:
                log.warning("Allocate refused: %s", exc)
                if self.hook is not None:
                    await self.hook(self.resource, None, str(exc))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                raise  # abort raises; this line is never reached
            # A pod is allocated once all its record's units of this resource were handed out
            # (each container of a multi-container pod asks a part).
            key = f"{pod.uid}|{self.resource}"
            self.granted[key] = self.granted.get(key, Counter()) + allocate.request_footprint(ids)
            assert pod.record is not None
            need = allocate.pod_footprint(self.resource, pod, self.devices.inv)
            if all(self.granted[key][u] >= n for u, n in need.items()):
                del self.granted[key]
                done[pod.key] = pod
            responses.append(
                pb.ContainerAllocateResponse(
                    envs=g.envs,
                    annotations=g.annotations,
                    cdi_devices=[pb.CDIDevice(name=n) for n in g.cdi_devices],
                    mounts=[
                        pb.Mount(container_path=c, host_path=h, read_only=ro)
                        for c, h, ro in g.mounts
                    ],
                )
            )
        for pod in done.values():
            if not pod.allocated:
                await self.source.mark_allocated(pod)
            if self.hook is not None:
                await self.hook(self.resource, pod, "")
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(  # noqa: N802 - the gRPC method name
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class _Plugin:
    """One resource's server on its socket."""

    def __init__(self, resource: str, path: Path) -> None:
        self.resource = resource
        self.path = path
        self.server: aio.Server | None = None
        self.stopping = asyncio.Event()
        self.inode = 0

    async def stop(self) -> None:
        self.stopping.set()
        if self.server is not None:
            await self.server.stop(grace=0.5)
            self.server = None


class DevicePlugins:
    """Serves every resource of ``devices``, registers them, and keeps them registered."""

    def __init__(
        self,
        devices: Devices,
        source: RecordSource,
        options: PluginOptions,
        *,
        hook: AllocationHook | None = None,
    ) -> None:
        self.devices = devices
        self.source = source
        self.options = options
        self.hook = hook
        self._plugins: dict[str, _Plugin] = {}
        self._granted: dict[str, Counter[str]] = {}  # pod uid|resource -> units handed out
        self._kubelet_id: tuple[int, ...] = ()  # identity of the kubelet.sock registered with
        self._kubelet_created = False  # a directory event said kubelet.sock was (re)created
        self._pending = False  # a registration failed: retry soon, not after a full interval
        self._wake = asyncio.Event()
        self._events: DirWatch | None = None
        self.registrations = 0  # successful Register calls (for logs and tests)
        self.registered = asyncio.Event()
        self._checking = asyncio.Lock()  # the watch and the agent's refresh both call check()
        # Per registration: ``epoch`` counts successful ones; the lists each resource's
        # ListAndWatch had sent, and the kubelet's checkpoint, as they were just before it
        # (node.kubelet_checkpoint: what the kubelet has taken in since).
        self.epoch = 0
        self.lists: Counter[str] = Counter()
        self._lists_before: Counter[str] = Counter()
        self.checkpoint_before: tuple[int, ...] = ()
        self.changed = asyncio.Event()  # set when the registration is lost or made

    @property
    def kubelet_socket(self) -> Path:
        return self.options.plugin_dir / KUBELET_SOCKET

    async def start(self) -> None:
        """Serve all resources and register each with the kubelet."""
        for resource in self.devices.resources():
            await self._serve(resource)
        await self.register_all()

    async def _serve(self, resource: str) -> _Plugin:
        old = self._plugins.get(resource)
        if old is not None:
            await old.stop()
        path = self.options.plugin_dir / socket_name(resource)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        plugin = _Plugin(resource, path)
        server = aio.server()
        servicer = _Servicer(
            resource,
            self.devices,
            self.source,
            self.options,
            hook=self.hook,
            stopping=plugin.stopping,
            granted=self._granted,
            lists=self.lists,
        )
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        plugin.server = server
        plugin.inode = _inode(path)
        self._plugins[resource] = plugin
        return plugin

    async def register_all(self) -> bool:
        """Register every served resource; False (and a log line) when the kubelet is not there."""
        self._kubelet_id = _identity(self.kubelet_socket)
        if not self._kubelet_id:
            log.info(
                "kubelet socket %s not there yet; will register when it appears",
                self.kubelet_socket,
            )
            return False
        # Before the first Register: the kubelet may open ListAndWatch before Register returns.
        lists_before = Counter(self.lists)
        checkpoint_before = kubelet_checkpoint.identity(self.checkpoint_path)
        try:
            async with aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                for resource, plugin in sorted(self._plugins.items()):
                    await stub.Register(
                        pb.RegisterRequest(
                            version=API_VERSION,
                            endpoint=plugin.path.name,
                            resource_name=resource,
                            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                        ),
                        timeout=self.options.register_timeout_s,
                    )
                    self.registrations += 1
                    log.info("registered %s on %s", resource, plugin.path)
        except grpc.RpcError as exc:
            log.warning("registering with the kubelet failed: %s", exc.details())
            self._kubelet_id = ()  # try again on the next check
            self._pending = True
            return False
        self._pending = False
        self._lists_before, self.checkpoint_before = lists_before, checkpoint_before
        self.epoch += 1
        self.registered.set()
        self.changed.set()
        return True

    @property
    def checkpoint_path(self) -> Path:
        return self.options.plugin_dir / kubelet_checkpoint.FILE

    def unlisted(self) -> list[str]:
        """Served resources whose ListAndWatch has sent no list since the last registration."""
        return [r for r in sorted(self._plugins) if self.lists[r] <= self._lists_before[r]]

    async def check(self) -> bool:
        """One watch step: serve again / re-register if the kubelet restarted (a directory event
        saw ``kubelet.sock`` created, or its identity changed, or the last registration failed)
        or one of our sockets was removed. True when it re-registered."""
        async with self._checking:
            return await self._check()

    async def _check(self) -> bool:
        if self._events is not None:
            self._events.drain()  # a creation event about the file stat() sees is consumed here
        missing = [r for r, p in self._plugins.items() if _inode(p.path) != p.inode]
        for resource in self.devices.resources():
            if resource not in self._plugins:
                missing.append(resource)
        kubelet = _identity(self.kubelet_socket)
        created, self._kubelet_created = self._kubelet_created, False
        if not missing and not created and (kubelet == self._kubelet_id or not kubelet):
            return False
        for resource in missing:
            log.info("socket for %s is gone; serving again", resource)
            await self._serve(resource)
        if kubelet:
            self.registered.clear()
            self.changed.set()
            return await self.register_all()
        return False

    def _on_event(self, name: str, mask: int) -> None:
        ours = {p.path.name for p in self._plugins.values()}
        if (name == KUBELET_SOCKET and mask & (IN_CREATE | IN_MOVED_TO)) or name == "":
            self._kubelet_created = True
        elif name != KUBELET_SOCKET and name not in ours:
            return
        self._wake.set()

    async def watch(self, interval_s: float) -> None:
        """Check on every directory event and every ``interval_s`` (sooner while a registration
        is failing) until cancelled."""
        retry_s = 0.05
        warned = False
        try:
            while True:
                if self.options.inotify and (self._events is None or not self._events.alive):
                    if self._events is not None:
                        self._events.close()
                    self._events = DirWatch.open(self.options.plugin_dir, self._on_event)
                    if self._events is None and not warned:
                        warned = True
                        log.warning(
                            "no directory events for %s (inotify unavailable); the check every "
                            "%.1f s alone detects kubelet restarts",
                            self.options.plugin_dir,
                            interval_s,
                        )
                    if self._events is not None:
                        self._wake.set()  # what changed before the watch existed: check now
                wait_s = min(retry_s, interval_s) if self._pending else interval_s
                # asyncio.wait, not wait_for: Python 3.11's wait_for loses a cancellation that
                # arrives as the event is set, and the watch would never stop.
                waiter = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({waiter}, timeout=wait_s)
                finally:
                    waiter.cancel()
                self._wake.clear()
                try:
                    await self.check()
                except Exception:  # keep watching; the next check retries
                    log.exception("device plugin check failed")
                    self._pending = True
                retry_s = min(retry_s * 2, 1.0) if self._pending else 0.05
        finally:
            if self._events is not None:
                self._events.close()
                self._events = None

    async def stop(self) -> None:
        for plugin in self._plugins.values():
            await plugin.stop()
            with contextlib.suppress(FileNotFoundError):
                if _inode(plugin.path) == plugin.inode:
                    plugin.path.unlink()
        self._plugins.clear()

    def sockets(self) -> dict[str, Path]:
        return {r: p.path for r, p in self._plugins.items()}


def _identity(path: Path) -> tuple[int, ...]:
    """What tells two files at ``path`` apart, even when the inode number is reused; () if none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ()
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return 0
