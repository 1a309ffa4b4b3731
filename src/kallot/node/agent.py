"""The node agent's composition: discovery -> device plugin, health, publishing, exporter.

One asyncio loop runs:

- the device plugin servers and their socket-directory watch (``deviceplugin``);
- an XID reader (NVML's event wait runs in a worker thread) feeding ``health.HealthTracker``;
  a transition updates ListAndWatch, the metrics and (with the API) an Event on the Node;
- a refresh every ``refresh_s``: discovery again (a changed inventory is re-advertised and
  re-published), health recovery, a metrics sample, NVML processes and the pods' records.

With ``AgentConfig.dra`` the agent is also (or, without ``device_plugin``, only) the DRA driver
``gpu.kallot.io`` (``draplugin.DraDriver``): it publishes the ResourceSlices on every refresh
and health change (only what changed reaches the API) and serves the kubelet's DRA plugin.
Both at once split the GPUs: DRA serves ``DraConfig.gpus``, the device plugin the others.

The clock is injected (``clock``) so tests drive recovery without sleeping.

Long module: the agent's composition root wires discovery, the device plugin, the DRA
driver, health, publishing and the exporter in one place, so the order of start-up is visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from kallot.config import wire
from kallot.config.inventory import NodeInventory
from kallot.k8sclient.delegated import DelegatedAuth
from kallot.node import cdi, kubelet_checkpoint, mps
from kallot.node.allocate import PodRecord
from kallot.node.deviceplugin import DevicePlugins, Devices, PluginOptions, RecordSource
from kallot.node.discovery import Backend, Sharing, XidEvent, build_inventory, gfd_labels
from kallot.node.dra import pcie_roots
from kallot.node.draplugin import ClaimSource, DraConfig, DraDriver, MigManager, SlicePublisher
from kallot.node.exporter import (
    Authorize,
    ExporterState,
    GpuCollector,
    make_registry,
    pod_uid_of_pid,
    serve,
)
from kallot.node.health import HealthTracker, Transition
from kallot.node.migapply import MigReconfigurer, NodeSource, mark_reconfigurable
from kallot.node.models import ModelCacheWatcher
from kallot.node.podresources import assignments_of, drift, holders_of, list_pod_resources

log = logging.getLogger(__name__)


class NodePublisher(Protocol):
    async def publish(self, labels: dict[str, str], inv: NodeInventory) -> bool: ...

    async def plugins_serving(self, ready: bool, message: str) -> None: ...


class EventSink(Protocol):
    async def on_node(self, reason: str, message: str, *, warning: bool) -> None: ...

    async def on_pod(self, pod: PodRecord, reason: str, message: str, *, warning: bool) -> None: ...


@dataclass
class AgentConfig:
    node: str
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    sharing: Sharing = field(default_factory=Sharing)
    health_recovery_s: float = 300.0
    refresh_s: float = 10.0
    watch_s: float = 1.0
    xid_wait_s: float = 1.0
    metrics_address: str = "0.0.0.0:9400"
    # HTTPS for the exporter (config.tls); with ``Agent(metrics_auth=...)`` (``--metrics-auth
    # delegated``) /metrics answers only bearer tokens RBAC lets get it (docs/security.md).
    metrics_tls: ssl.SSLContext | None = None
    cdi_kind: str = wire.CDI_KIND_GPU
    #: where the device plugin's own CDI spec is written (node.cdi; None: not at all, the
    #: names come from NVIDIA's toolkit spec or there are none), and where the GPUs' device
    #: nodes are on the host (the fake backend's stand-ins live elsewhere).
    cdi_dir: Path | None = None
    dev_root: Path = cdi.DEV
    mps_pipe_dir: str = ""
    dra: DraConfig | None = None  # serve DRA (driver gpu.kallot.io)
    device_plugin: bool = True  # serve the device plugin (for the GPUs DRA does not serve)
    #: advertise MPS shares only while an MPS control daemon answers (node.mps); without one,
    #: GPUs configured for MPS are advertised as exclusive whole GPUs.
    require_mps_daemon: bool = False
    # DCGM-named series: "on", "off", or "auto" (off while a dcgm-exporter pod runs on the node,
    # which exports the same GPUs: dashboards would count them twice)
    dcgm_series: str = "auto"
    # Apply the MIG re-layouts the scheduler plans (kallot.io/mig-plan; node.migapply) on the
    # MIG GPUs the device plugin serves, and publish them as migReconfigurable.
    mig_reconfigure: bool = False


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: Backend,
        records: RecordSource,
        *,
        publisher: NodePublisher | None = None,
        events: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        pod_of_pid: Callable[[int], str | None] = pod_uid_of_pid,
        claims: ClaimSource | None = None,
        slices: SlicePublisher | None = None,
        mig: MigManager | None = None,
        models: ModelCacheWatcher | None = None,
        node_source: NodeSource | None = None,
        metrics_auth: DelegatedAuth | None = None,
    ) -> None:
        self.config = config
        self.metrics_auth = metrics_auth
        self.backend = backend
        self.records = records
        self.publisher = publisher
        self.events = events
        self.clock = clock
        self.models = models  # the model-cache watch (node.models), a task of its own
        self._mps_ok = True
        self.inventory = self._reconfigurable(build_inventory(backend.raw(), self._sharing()))
        self.health = HealthTracker(
            [d.uuid for d in self.inventory.devices], config.health_recovery_s
        )
        self.devices = Devices(self._plugin_view(self.inventory))
        self.dra: DraDriver | None = None
        if config.dra is not None:
            if claims is None:
                raise ValueError("the DRA driver needs a claim source")
            if mig is None and hasattr(backend, "create_mig"):
                mig = backend  # type: ignore[assignment]  # the fake backend's in-memory MIG
            self.dra = DraDriver(
                config.dra,
                self.inventory,
                claims,
                mig,
                publisher=slices,
                pcie_roots=pcie_roots(self.inventory, config.dra.sysfs) if config.dra.sysfs else {},
            )
        self.plugins = DevicePlugins(
            self.devices,
            records,
            PluginOptions(
                node=config.node,
                plugin_dir=config.plugin_dir,
                cdi_kind=config.cdi_kind,
                mps_pipe_dir=config.mps_pipe_dir,
            ),
            hook=self._on_allocation,
        )
        self.reconfigurer: MigReconfigurer | None = None
        if config.mig_reconfigure and config.device_plugin and node_source is not None:
            manager = mig if mig is not None else backend
            if not hasattr(manager, "create_mig"):
                raise ValueError("--mig-reconfigure needs a backend that can create MIG instances")
            self.reconfigurer = MigReconfigurer(
                config.node,
                _MigOps(backend, manager),  # type: ignore[arg-type]
                records,
                node_source,
                advertise=self.refresh,
                events=events,
                pod_resources_socket=config.pod_resources_socket,
                gpus=self._plugin_gpus(self.inventory),
                busy_uuids=lambda: {p.uuid for p in backend.processes()},
                on_status=self._count_mig_plan,
            )
        self.state = ExporterState(node=config.node, inventory=self.inventory)
        self.collector = GpuCollector(self.state, pod_of_pid=pod_of_pid)
        self.registry = make_registry(self.collector)
        self.transitions: list[Transition] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._httpd: Any = None
        self.metrics_port = 0
        self._reported_drift: set[tuple[str, str, str]] = set()
        self._stopping = asyncio.Event()
        self._dcgm_exporter_seen = False
        self._settled_epoch = -1  # the registration (DevicePlugins.epoch) found settled
        self._condition: tuple[bool, str] | None = None  # last written to the Node

    # -- lifecycle -----------------------------------------------------------------------------

    def _plugin_view(self, inv: NodeInventory) -> NodeInventory:
        """The GPUs the device plugin advertises: all, or those DRA does not serve, or none."""
        cfg = self.config
        if not cfg.device_plugin:
            return inv.model_copy(update={"devices": ()})
        if cfg.dra is None:
            return inv
        dra_gpus = cfg.dra.gpus
        if dra_gpus is None:
            return inv.model_copy(update={"devices": ()})
        return inv.model_copy(
            update={"devices": tuple(d for d in inv.devices if d.index not in dra_gpus)}
        )

    def _write_cdi(self, inv: NodeInventory) -> None:
        """The spec defining the CDI names Allocate answers, when the agent owns that kind."""
        cfg = self.config
        if cfg.cdi_dir is not None and cfg.cdi_kind == cdi.DEVICE_PLUGIN_KIND:
            cdi.write_device_plugin_spec(cfg.cdi_dir, self._plugin_view(inv), cfg.dev_root)

    def _count_mig_plan(self, status: Any) -> None:
        plans = dict(self.state.mig_plans)
        plans[status.state] = plans.get(status.state, 0) + 1
        self.collector.update(mig_plans=plans)

    def _mark_dra(self, inv: NodeInventory) -> NodeInventory:
        """The inventory the scheduler reads, each GPU the DRA driver serves marked ``dra``: it
        is the DRA pool's alone (the node's ResourceSlices), and counted in both the scheduler
        would hand it to a ``nvidia.com/gpu`` pod too (a new leader did, on the real node)."""
        if self.config.dra is None:
            return inv
        plugin = {d.index for d in self._plugin_view(inv).devices}
        return inv.model_copy(
            update={
                "devices": tuple(
                    d if d.index in plugin else d.model_copy(update={"dra": True})
                    for d in inv.devices
                )
            }
        )

    def _plugin_gpus(self, inv: NodeInventory) -> set[int] | None:
        """GPU indices the device plugin serves (None: all)."""
        return {d.index for d in self._plugin_view(inv).devices}

    def _reconfigurable(self, inv: NodeInventory) -> NodeInventory:
        """With ``mig_reconfigure``, the device plugin's MIG GPUs marked migReconfigurable."""
        cfg = self.config
        if not (cfg.mig_reconfigure and cfg.device_plugin):
            return inv
        return mark_reconfigurable(inv, self._plugin_gpus(inv))

    async def start(self, *, serve_metrics: bool = True) -> None:
        if serve_metrics:
            self._httpd, self.metrics_port = serve(
                self.registry,
                self.config.metrics_address,
                healthy=self.healthy,
                ready=self.ready,
                tls=self.config.metrics_tls,
                authorize=self._authorizer(),
            )
        await self.records.start()  # the API source: a node-scoped pod informer
        if self.config.device_plugin:
            self._write_cdi(self.inventory)
            await self.plugins.start()
        if self.dra is not None:
            await self.dra.start()
        await self.refresh()
        self._tasks = [
            asyncio.create_task(self._xid_loop(), name="xids"),
            asyncio.create_task(self._refresh_loop(), name="refresh"),
        ]
        if self.config.device_plugin:
            self._tasks.append(
                asyncio.create_task(self.plugins.watch(self.config.watch_s), name="plugin-watch")
            )
            if self.publisher is not None:
                self._tasks.append(asyncio.create_task(self._serving_loop(), name="serving"))
        if self.models is not None:
            self._tasks.append(asyncio.create_task(self.models.run(), name="model-cache"))
        if self.reconfigurer is not None:
            self._tasks.append(asyncio.create_task(self.reconfigurer.run(), name="mig-plans"))

    def _authorizer(self) -> Authorize | None:
        """The exporter's check of a scrape (its threads ask this event loop's DelegatedAuth)."""
        auth = self.metrics_auth
        if auth is None:
            return None
        loop = asyncio.get_running_loop()

        def authorize(header: str | None, path: str) -> tuple[int, str]:
            try:
                v = asyncio.run_coroutine_threadsafe(auth.check(header, path), loop).result(15)
            except (TimeoutError, RuntimeError) as exc:  # a stopping or stuck loop
                return 503, f"authorization is unavailable: {exc or 'timed out'}"
            return v.status, v.reason

        return authorize

    def _sharing(self) -> Sharing:
        """The configured sharing, with MPS replaced by exclusive while no daemon answers."""
        sharing = self.config.sharing
        uses_mps = sharing.mode == "mps" or "mps" in sharing.per_gpu.values()
        if not (self.config.require_mps_daemon and uses_mps):
            return sharing
        ok = mps.daemon_answers(self.config.mps_pipe_dir or mps.DEFAULT_PIPE_DIR)
        if ok != self._mps_ok:
            log.warning(
                "MPS control daemon %s in %s: MPS GPUs advertised %s",
                "answers" if ok else "does not answer",
                self.config.mps_pipe_dir or mps.DEFAULT_PIPE_DIR,
                "as MPS shares" if ok else "whole (exclusive)",
            )
        self._mps_ok = ok
        if ok:
            return sharing
        return replace(
            sharing,
            mode="exclusive" if sharing.mode == "mps" else sharing.mode,
            per_gpu={i: "exclusive" if m == "mps" else m for i, m in sharing.per_gpu.items()},
        )

    def healthy(self) -> bool:
        """/healthz: no loop of the agent has died (the kubelet restarts the container if one has)."""
        return not any(t.done() for t in self._tasks)

    def ready(self) -> bool:
        """/readyz: started (plugins registered, first refresh done) and healthy."""
        return bool(self._tasks) and self.healthy()

    async def stop(self) -> None:
        # The XID reader is inside a blocking NVML wait in a worker thread: let it return (at
        # most xid_wait_s) before the backend is closed, instead of abandoning the thread.
        self._stopping.set()
        xids = [t for t in self._tasks if t.get_name() == "xids"]
        if xids:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(xids[0]), self.config.xid_wait_s + 5)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        await self.records.stop()
        if self.config.device_plugin:
            await self.plugins.stop()
        if self.dra is not None:
            await self.dra.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd = None

    # -- the kubelet's view -----------------------------------------------------------------

    async def plugins_serving(self) -> tuple[bool, str]:
        """Whether a GPU pod bound to this node now gets its record's devices from the kubelet
        (``node.kubelet_checkpoint``), and why not. Checked after every registration until it
        holds once: the kubelet then frees what deleted pods held at each allocation."""
        plugins = self.plugins
        if not plugins.registered.is_set():
            return False, "the device plugins are not registered with the kubelet"
        if self._settled_epoch == plugins.epoch:
            return True, ""
        unlisted = plugins.unlisted()
        if unlisted:
            return False, f"the kubelet has not asked for the devices of {', '.join(unlisted)} yet"
        path = plugins.checkpoint_path
        ident = kubelet_checkpoint.identity(path)
        if ident:  # a kubelet that keeps no checkpoint (a stand-in) has only the lists to show
            if ident == plugins.checkpoint_before:
                return (
                    False,
                    "the kubelet has not written its device checkpoint since we registered",
                )
            try:
                cp = kubelet_checkpoint.Checkpoint.parse(path.read_bytes())
            except (OSError, ValueError) as exc:  # mid-rename, or not the kubelet's format
                return False, f"reading {path}: {exc}"
            advertised = {
                r: {d.id for d in self.devices.of(r) if d.healthy} for r in self.devices.resources()
            }
            why = kubelet_checkpoint.not_listed(cp, advertised)
            if why:
                return False, why
            live = {p.uid for p in await self.records.pods(fresh=True)}
            stale = kubelet_checkpoint.stale(cp, live, set(self.devices.resources()))
            if stale:
                await self._free_stale(stale)
                return False, kubelet_checkpoint.describe_stale(stale)
        self._settled_epoch = plugins.epoch
        return True, ""

    async def _free_stale(self, stale: list[kubelet_checkpoint.Charge]) -> None:
        """Ask the kubelet to free what pods that are gone hold (pod-resources List runs its
        UpdateAllocatedDevices) and to write the result (a ListAndWatch list)."""
        sock = self.config.pod_resources_socket
        if sock.is_socket():
            with contextlib.suppress(Exception):  # the kubelet may be restarting: next round
                await list_pod_resources(sock)
        await self.devices.resend(stale[0].resource)

    async def _serving_loop(self) -> None:
        """The Node condition, written when it changes (every ``watch_s`` a check)."""
        assert self.publisher is not None
        while True:
            try:
                ready, why = await self.plugins_serving()
                if (ready, why) != self._condition:
                    await self.publisher.plugins_serving(ready, why)
                    self._condition = (ready, why)  # only once written: a failure retries
                    log.info("device plugins %s%s", "ready" if ready else "not ready: ", why)
            except Exception as exc:  # the API or the file may be briefly away: next round
                log.warning("device plugin readiness on %s: %s", self.config.node, exc)
            # Woken at once when the registration is lost or made (a kubelet restart): the
            # scheduler should hear "not ready" before it binds into the window.
            changed = self.plugins.changed
            waiter = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait({waiter}, timeout=self.config.watch_s)
            finally:
                waiter.cancel()
            changed.clear()

    # -- health --------------------------------------------------------------------------------

    async def handle_xids(self, events: list[XidEvent]) -> list[Transition]:
        now = self.clock()
        out = []
        for e in events:
            self.state.last_xid[e.uuid] = e.xid
            t = self.health.observe(e.uuid, e.xid, now)
            if t is not None:
                out.append(t)
        self.state.xid_counts = {u: self.health.xid_count(u) for u in self._uuids()}
        await self._apply(out)
        return out

    async def _apply(self, transitions: list[Transition]) -> None:
        if not transitions:
            return
        unhealthy = self.health.unhealthy()
        self.collector.update(unhealthy=set(unhealthy))
        await self.devices.update(unhealthy=unhealthy)
        if self.dra is not None:
            await self.dra.update(unhealthy=unhealthy, reasons=self.health.reasons())
        for t in transitions:
            self.transitions.append(t)
            to = "Healthy" if t.healthy else "Unhealthy"
            key = (t.uuid, to)
            self.state.transitions[key] = self.state.transitions.get(key, 0) + 1
            log.warning("GPU %s is %s: %s", t.uuid, to, t.reason)
            if self.events is not None:
                await self.events.on_node(
                    "GPUHealthy" if t.healthy else "GPUUnhealthy",
                    f"GPU {t.uuid}: {to} ({t.reason})",
                    warning=not t.healthy,
                )

    def _uuids(self) -> list[str]:
        out = []
        for d in self.inventory.devices:
            out.append(d.uuid)
            out.extend(m.uuid for m in d.mig if m.uuid)
        return out

    async def _xid_loop(self) -> None:
        while not self._stopping.is_set():
            events = await asyncio.to_thread(self.backend.wait_xids, self.config.xid_wait_s)
            if events:
                await self.handle_xids(events)

    # -- refresh -------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Re-discover, recover, sample, publish. Called every ``refresh_s`` and at start."""
        raw = await asyncio.to_thread(self.backend.raw)
        mps_before = self._mps_ok
        inv = self._reconfigurable(build_inventory(raw, self._sharing()))
        if self._mps_ok != mps_before and self.events is not None:
            reason, text = (
                ("MPSDaemonAnswers", "MPS control daemon answers: advertising MPS shares")
                if self._mps_ok
                else ("NoMPSDaemon", "no MPS control daemon answers: MPS GPUs advertised whole")
            )
            await self.events.on_node(reason, text, warning=not self._mps_ok)
        await self._apply(self.health.tick(self.clock()))
        # Health is part of what the scheduler reads: publish it in the inventory.
        unhealthy = self.health.unhealthy()
        published = inv.model_copy(
            update={
                "devices": tuple(
                    d.model_copy(update={"healthy": d.healthy and d.uuid not in unhealthy})
                    for d in inv.devices
                )
            }
        )
        if inv != self.inventory:
            log.info("inventory changed; advertising again")
            self.inventory = inv
            for u in self._uuids():
                self.health.add(u)
            if self.config.device_plugin:
                self._write_cdi(inv)  # before the kubelet can allocate a new device
            await self.devices.update(inv=self._plugin_view(inv))
            if self.config.device_plugin and self._tasks:
                # A new resource (a MIG profile a re-layout created) is served and registered
                # now, before the inventory that shows it is published.
                await self.plugins.check()
            self.collector.update(inventory=inv)
        samples = await asyncio.to_thread(self.backend.metrics)
        processes = await asyncio.to_thread(self.backend.processes)
        try:
            pods = await self.records.pods()
        except Exception as exc:  # the API may be briefly away; keep the last pods
            log.warning("reading pods failed: %s", exc)
            pods = self.state.pods
        self.collector.update(samples=samples, processes=processes, pods=pods)
        self.collector.update(dcgm_series=self._dcgm_series())
        await self._check_kubelet_assignments(pods)
        if self.dra is not None:
            # ResourceSlices: only a change reaches the API (dra_api.SlicePublisher).
            await self.dra.update(inventory=inv, unhealthy=unhealthy, reasons=self.health.reasons())
        if self.publisher is not None:
            try:
                await self.publisher.publish(gfd_labels(published), self._mark_dra(published))
            except Exception as exc:
                log.warning("publishing node %s failed: %s", self.config.node, exc)

    def _dcgm_series(self) -> bool:
        mode = self.config.dcgm_series
        if mode != "auto":
            return mode == "on"
        images = getattr(self.records, "images", None)  # the API source knows the node's pods
        others = images() if callable(images) else []
        present = any("dcgm-exporter" in i for i in others)
        if present != self._dcgm_exporter_seen:
            self._dcgm_exporter_seen = present
            log.info(
                "dcgm-exporter %s on this node: DCGM-named series %s",
                "runs" if present else "does not run",
                "off (kallot_* only)" if present else "on",
            )
        return not present

    async def _check_kubelet_assignments(self, pods: list[PodRecord]) -> None:
        """Compare what the kubelet assigned (pod-resources API) with the records."""
        sock = self.config.pod_resources_socket
        if not sock.is_socket():
            return
        try:
            resp = await list_pod_resources(sock)
        except Exception as exc:  # the kubelet may be restarting; try again next refresh
            log.warning("pod-resources %s: %s", sock, exc)
            return
        assigned = assignments_of(resp)
        self.collector.update(holders=holders_of(resp))
        drifts = drift(assigned, pods, self.inventory, self.devices.resources())
        self.collector.update(drifts=drifts)
        keys = set()
        for d in drifts:
            key = (d.namespace, d.pod, d.resource)
            keys.add(key)
            if key in self._reported_drift:
                continue
            log.warning("%s", d.message())
            if self.events is not None:
                await self.events.on_node("DeviceRecordMismatch", d.message(), warning=True)
        self._reported_drift = keys

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_s)
            try:
                await self.refresh()
            except Exception:
                log.exception("refresh failed")

    async def _on_allocation(self, resource: str, pod: PodRecord | None, error: str) -> None:
        if self.events is None:
            return
        if pod is None:
            await self.events.on_node("AllocationRefused", f"{resource}: {error}", warning=True)
        else:
            await self.events.on_pod(
                pod,
                "DevicesAllocated",
                f"{resource}: devices of the device record handed out",
                warning=False,
            )


class _MigOps:
    """``migapply.MigBackend``: discovery from the backend, MIG changes from the manager (the
    fake backend is both; on a GPU machine ``nvml_mig.NvmlMig``)."""

    def __init__(self, backend: Backend, manager: MigManager) -> None:
        self.raw = backend.raw
        self.create_mig = manager.create_mig
        self.destroy_mig = manager.destroy_mig
