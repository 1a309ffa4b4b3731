"""``kallot agent``: the node agent (DaemonSet). ``run`` serves the device plugin, health, the
exporter and publishing; ``inventory`` prints what discovery finds and exits.

Composition root for the node shell: picks the backend (NVML, or the fake backend with
``--inventory-file FILE``), the record source (the API server, or none with ``--no-kube``) and
runs ``kallot.node.agent.Agent`` until SIGTERM/SIGINT.

Long module: every agent flag, its validation (one-line errors naming the flag) and the wiring
of the parts it selects live together, so one file shows the whole command line the DaemonSet
passes; the parts themselves are in ``kallot.node``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import click
import typer

from kallot.config import tls
from kallot.config.inventory import NodeInventory
from kallot.config.model_cache import ModelCacheInventory
from kallot.core.errors import ConfigError, KallotError
from kallot.node import cdi, models
from kallot.node.discovery import Backend, Sharing, build_inventory, gfd_labels
from kallot.node.flags import check_run as check_run_flags
from kallot.node.flags import sharing_flags

if TYPE_CHECKING:
    from kallot.node.draplugin import MigManager

InventoryFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory-file",
        help="fake backend: read the node from this YAML/JSON file instead of NVML",
        dir_okay=False,
    ),
]
SharingOpt = Annotated[
    str,
    typer.Option(
        "--sharing",
        click_type=click.Choice(["exclusive", "time-slicing", "mps"]),
        help="how GPUs not in MIG mode are shared",
    ),
]
ReplicasOpt = Annotated[int, typer.Option("--replicas", min=1, help="time-slicing replicas")]
ModelCacheOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--model-cache",
        help="model cache directory to scan, watch and publish (repeatable; docs/node-inventory.md)",
    ),
]
ModelManifestOpt = Annotated[
    list[Path] | None,
    typer.Option("--model-manifest", help="model manifest file (JSON, repeatable)"),
]
ModelBandwidthOpt = Annotated[
    float,
    typer.Option(
        "--model-read-gbps", min=0, help="the cache disk's read bandwidth, GB/s (0: measure it)"
    ),
]
ModelPollOpt = Annotated[
    float,
    typer.Option(
        "--model-cache-poll-seconds",
        min=0,
        help="poll the caches this often instead of an inotify watch (0: inotify)",
    ),
]


DraMigOpt = Annotated[
    str,
    typer.Option(
        "--dra-mig",
        help="DRA, GPUs in MIG mode: dynamic (publish every placement, create at prepare) or "
        "static (existing instances only)",
    ),
]


# A Node's name is a DNS-1123 subdomain; the agent's ResourceSlices are named after it.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SLICE_SUFFIX = len("-gpu.kallot.io-99")


def node_name_of(value: str, command: str) -> str:
    """``--node-name`` (default: the hostname), refused unless it can name a Node and the
    ResourceSlices the agent publishes: one line, exit code 2."""
    name = value or socket.gethostname()
    if len(name) + _SLICE_SUFFIX > 253 or not _NODE_NAME.fullmatch(name):
        what = "given" if value else "the hostname"
        typer.echo(
            f"{command}: --node-name: got {name!r} ({what}), expected a Kubernetes node name "
            "(lowercase letters, digits, '-' and '.', starting and ending with a letter or "
            f"digit, at most {253 - _SLICE_SUFFIX} characters)",
            err=True,
        )
        raise typer.Exit(2)
    return name


def _dra_mig(value: str) -> Literal["dynamic", "static"]:
    if value not in ("dynamic", "static"):
        raise typer.BadParameter(
            f"got {value!r}, expected dynamic or static", param_hint="--dra-mig"
        )
    return "dynamic" if value == "dynamic" else "static"


def _print_slices(
    inv: NodeInventory,
    node: str,
    mig: Literal["dynamic", "static"],
    *,
    as_json: bool,
    sysfs: str,
) -> None:
    from kallot.node.dra import DraOptions, pcie_roots, resource_slices

    roots = pcie_roots(inv, sysfs) if sysfs else {}
    opts = DraOptions(node=node, mig=mig, pcie_roots=roots)
    slices = resource_slices(inv, opts)
    if as_json:
        typer.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": slices}, indent=2))
        return
    for s in slices:
        spec = s["spec"]
        devices = spec.get("devices") or []
        sets = spec.get("sharedCounters") or []
        what = f"{len(devices)} devices" if devices else f"{len(sets)} counter sets"
        typer.echo(f"{s['metadata']['name']}: pool {spec['pool']['name']}, {what}")
        for d in devices:
            taint = " (tainted)" if d.get("taints") else ""
            typer.echo(f"  {d['name']} {d['attributes']['type']['string']}{taint}")


def _nvml_mig() -> MigManager:
    from kallot.node.nvml_mig import NvmlMig

    return NvmlMig()


def _backend(inventory_file: Path | None) -> tuple[Backend, Sharing | None]:
    if inventory_file is not None:
        from kallot.node.fake import FakeBackend

        fake = FakeBackend.from_file(inventory_file)
        # A file without a sharing section leaves the modes to --sharing / --replicas.
        return fake, fake.sharing() if "sharing" in fake.spec.model_fields_set else None
    from kallot.node.nvml import NvmlBackend

    return NvmlBackend(), None


def _sharing(mode: str, replicas: int) -> Sharing:
    if mode not in ("exclusive", "time-slicing", "mps"):
        raise typer.BadParameter(
            f"got {mode!r}, expected exclusive, time-slicing or mps", param_hint="--sharing"
        )
    m: Literal["exclusive", "time-slicing", "mps"] = mode  # type: ignore[assignment]
    return Sharing(mode=m, replicas=replicas)


def inventory_cmd(  # noqa: PLR0917 - typer maps parameters to options
    inventory_file: InventoryFileOpt = None,
    output: Annotated[
        str,
        typer.Option(
            "--format",
            click_type=click.Choice(["text", "json"]),
            help="json: the inventory and the labels as one JSON document",
        ),
    ] = "text",
    sharing: SharingOpt = "mps",
    replicas: ReplicasOpt = 1,
    dra: Annotated[
        bool, typer.Option("--dra", help="print the DRA ResourceSlices the agent would publish")
    ] = False,
    dra_mig: DraMigOpt = "dynamic",
    node_name: Annotated[str, typer.Option("--node-name", envvar="NODE_NAME")] = "",
) -> None:
    """Discover this node's GPUs, print the inventory the agent would publish, and exit."""
    as_json = output == "json"
    try:
        backend, file_sharing = _backend(inventory_file)
        try:
            if file_sharing is not None:  # the file's sharing section wins: refuse the flags
                sharing_flags(
                    file_sets_sharing=True, sharing=sharing, replicas=replicas, default=("mps", 1)
                )
            inv = build_inventory(backend.raw(), file_sharing or _sharing(sharing, replicas))
        finally:
            backend.close()
    except KallotError as exc:
        typer.echo(f"kallot agent inventory: {exc}", err=True)
        raise typer.Exit(2) from exc
    if dra:
        _print_slices(
            inv,
            node_name_of(node_name, "kallot agent inventory"),
            _dra_mig(dra_mig),
            as_json=as_json,
            sysfs="" if inventory_file else "/sys",
        )
        return
    labels = gfd_labels(inv)
    if as_json:
        doc = {"inventory": json.loads(inv.to_json()), "labels": labels}
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(f"driver {inv.driver_version or '?'}, CUDA {inv.cuda_version or '?'}")
    for d in inv.devices:
        mig = ", ".join(f"{m.profile}@{m.start}" for m in d.mig)
        typer.echo(
            f"GPU {d.index} {d.uuid} {d.model} {d.mem_mib} MiB mode={d.mode} numa={d.numa} "
            f"island={d.island}" + (f" mig=[{mig}]" if mig else "")
        )
    for k, v in sorted(labels.items()):
        typer.echo(f"{k}={v}")


def metrics_cmd(
    inventory_file: InventoryFileOpt = None,
    sharing: SharingOpt = "mps",
    replicas: ReplicasOpt = 1,
    node_name: Annotated[str, typer.Option("--node-name", envvar="NODE_NAME")] = "",
) -> None:
    """Sample the GPUs once, serve /metrics on a loopback port, scrape it once, print it, exit."""
    import urllib.request

    from kallot.node.exporter import ExporterState, GpuCollector, make_registry, serve

    try:
        backend, file_sharing = _backend(inventory_file)
        try:
            if file_sharing is not None:  # the file's sharing section wins: refuse the flags
                sharing_flags(
                    file_sets_sharing=True, sharing=sharing, replicas=replicas, default=("mps", 1)
                )
            inv = build_inventory(backend.raw(), file_sharing or _sharing(sharing, replicas))
            state = ExporterState(node=node_name_of(node_name, "kallot agent"), inventory=inv)
            collector = GpuCollector(state)
            collector.update(samples=backend.metrics(), processes=backend.processes())
        finally:
            backend.close()
    except KallotError as exc:
        typer.echo(f"kallot agent metrics: {exc}", err=True)
        raise typer.Exit(2) from exc
    httpd, port = serve(make_registry(collector), "127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            typer.echo(resp.read().decode(), nl=False)
    finally:
        httpd.shutdown()


def run_cmd(  # noqa: PLR0917 - typer maps parameters to options
    node_name: Annotated[
        str,
        typer.Option(
            "--node-name", envvar="NODE_NAME", help="this node's name (default: hostname)"
        ),
    ] = "",
    inventory_file: InventoryFileOpt = None,
    device_plugin_dir: Annotated[
        Path, typer.Option("--device-plugin-dir", help="the kubelet's device plugin directory")
    ] = Path("/var/lib/kubelet/device-plugins"),
    pod_resources_socket: Annotated[
        Path,
        typer.Option("--pod-resources-socket", help="the kubelet's pod-resources socket"),
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="kubeconfig (default: in-cluster)")
    ] = None,
    no_kube: Annotated[
        bool,
        typer.Option("--no-kube", help="do not talk to the API (no records: Allocate refuses)"),
    ] = False,
    sharing: SharingOpt = "mps",
    replicas: ReplicasOpt = 1,
    health_recovery_seconds: Annotated[
        float,
        typer.Option(
            "--health-recovery-seconds",
            min=0,
            help="a GPU without a new fatal XID for this long is Healthy again",
        ),
    ] = 300.0,
    refresh_seconds: Annotated[
        float, typer.Option("--refresh-seconds", min=0.1, help="discovery/metrics refresh")
    ] = 10.0,
    metrics_address: Annotated[
        str, typer.Option("--metrics-address", help="host:port of /metrics")
    ] = "0.0.0.0:9400",
    metrics_auth: Annotated[
        str,
        typer.Option(
            "--metrics-auth",
            click_type=click.Choice(["none", "delegated"]),
            help="delegated: HTTPS, and /metrics only for bearer tokens RBAC lets get "
            "/metrics (TokenReview + SubjectAccessReview, as kube-scheduler; the chart's "
            "default); probes stay open",
        ),
    ] = "none",
    tls_cert_file: Annotated[
        Path | None,
        typer.Option("--tls-cert-file", help="PEM certificate (default: self-signed)"),
    ] = None,
    tls_private_key_file: Annotated[
        Path | None, typer.Option("--tls-private-key-file", help="PEM key of --tls-cert-file")
    ] = None,
    mps_pipe_dir: Annotated[
        str,
        typer.Option(
            "--mps-pipe-dir", help="MPS control daemon pipe directory to mount (MPS clients)"
        ),
    ] = "",
    require_mps_daemon: Annotated[
        bool | None,
        typer.Option(
            "--require-mps-daemon/--no-require-mps-daemon",
            help="advertise MPS shares only while an MPS control daemon answers in the pipe "
            "directory (default: on with NVML, off with --inventory-file)",
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            click_type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
        ),
    ] = "info",
    dcgm_series: Annotated[
        str,
        typer.Option(
            "--dcgm-series",
            click_type=click.Choice(["auto", "on", "off"]),
            help="DCGM-named GPU series: auto (off while dcgm-exporter runs on the node), on, off",
        ),
    ] = "auto",
    dra: Annotated[
        bool,
        typer.Option(
            "--dra",
            help="be the DRA driver gpu.kallot.io: publish ResourceSlices, serve the kubelet's "
            "DRA plugin (alone, or with --device-plugin on other GPUs)",
        ),
    ] = False,
    device_plugin: Annotated[
        bool | None,
        typer.Option(
            "--device-plugin/--no-device-plugin",
            help="serve the device plugin (default: on without --dra, off with it)",
        ),
    ] = None,
    dra_gpus: Annotated[
        str,
        typer.Option(
            "--dra-gpus",
            help="with --dra --device-plugin: GPU indices DRA serves, e.g. 0,1 (default: the "
            "GPUs in MIG mode); the device plugin serves the others",
        ),
    ] = "",
    dra_mig: DraMigOpt = "dynamic",
    cdi_dir: Annotated[
        Path,
        typer.Option(
            "--cdi-dir", help="where the agent writes its CDI specs (device plugin and DRA)"
        ),
    ] = Path("/var/run/cdi"),
    cdi_devices: Annotated[
        str,
        typer.Option(
            "--cdi-devices",
            click_type=click.Choice(["kallot", "nvidia", "none"]),
            help="CDI names the device plugin answers: kallot (its own spec in --cdi-dir), "
            "nvidia (NVIDIA toolkit's spec, UUID names), none (environment only)",
        ),
    ] = "kallot",
    dev_root: Annotated[
        Path,
        typer.Option(
            "--dev-root",
            help="where the GPUs' device nodes are on the host; with --inventory-file and a "
            "directory other than /dev, the agent creates stand-in character devices there",
        ),
    ] = Path("/dev"),
    kubelet_plugins_dir: Annotated[
        Path, typer.Option("--kubelet-plugins-dir", help="the kubelet's plugins directory")
    ] = Path("/var/lib/kubelet/plugins"),
    kubelet_registry_dir: Annotated[
        Path,
        typer.Option("--kubelet-registry-dir", help="the kubelet's plugins_registry directory"),
    ] = Path("/var/lib/kubelet/plugins_registry"),
    model_cache: ModelCacheOpt = None,
    model_manifest: ModelManifestOpt = None,
    model_read_gbps: ModelBandwidthOpt = 0.0,
    model_cache_poll_seconds: ModelPollOpt = 0.0,
    mig_reconfigure: Annotated[
        bool,
        typer.Option(
            "--mig-reconfigure",
            help="apply the MIG re-layouts the scheduler plans (kallot.io/mig-plan) on the MIG "
            "GPUs the device plugin serves: idle instances only (docs/node-agent.md)",
        ),
    ] = False,
) -> None:
    """Run the node agent: device plugin and/or DRA driver, health, exporter, publishing."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from kallot.node.agent import Agent, AgentConfig
    from kallot.node.deviceplugin import StaticRecordSource

    node = node_name_of(node_name, "kallot agent")
    serve_plugin = (not dra) if device_plugin is None else device_plugin
    if dra and no_kube:
        typer.echo(
            "kallot agent: --dra needs the API (claims are read from it); drop --no-kube", err=True
        )
        raise typer.Exit(2)
    if not dra and not serve_plugin:
        typer.echo("kallot agent: --no-device-plugin without --dra serves nothing", err=True)
        raise typer.Exit(2)
    if mig_reconfigure and (no_kube or not serve_plugin):
        typer.echo(
            "kallot agent: --mig-reconfigure needs the API and the device plugin (plans are "
            "read from the Node); drop --no-kube / --no-device-plugin",
            err=True,
        )
        raise typer.Exit(2)
    mig_mode = _dra_mig(dra_mig)
    try:  # one line per bad flag, before anything starts (kallot.node.flags)
        check_run_flags(
            inventory_file=inventory_file,
            sharing=sharing,
            replicas=replicas,
            device_plugin_dir=device_plugin_dir if serve_plugin else None,
            metrics_address_=metrics_address,
            kubeconfig_=None if no_kube else kubeconfig,
        )
    except KallotError as exc:
        typer.echo(f"kallot agent: {exc}", err=True)
        raise typer.Exit(2) from exc
    gpus: frozenset[int] | None = None
    if dra_gpus:
        try:
            gpus = frozenset(int(x) for x in dra_gpus.split(",") if x.strip())
        except ValueError:
            raise typer.BadParameter(
                f"got {dra_gpus!r}, expected GPU indices like 0,1", param_hint="--dra-gpus"
            ) from None

    async def main() -> None:
        backend, file_sharing = _backend(inventory_file)
        if inventory_file is not None and dev_root != cdi.DEV:
            cdi.make_fake_device_nodes(dev_root, [g.index for g in backend.raw().gpus])
        dra_config = None
        if dra:
            from kallot.node.draplugin import DraConfig

            dra_gpus_set = gpus
            if dra_gpus_set is None and serve_plugin:
                # Both: DRA takes the GPUs in MIG mode (dynamic MIG), the device plugin the rest.
                raw = backend.raw()
                dra_gpus_set = frozenset(g.index for g in raw.gpus if g.mig_enabled)
            elif dra_gpus_set is not None:
                have = {g.index for g in backend.raw().gpus}
                if not dra_gpus_set <= have:
                    raise ConfigError(
                        "--dra-gpus", dra_gpus, f"indices of this node's GPUs {sorted(have)}"
                    )
            dra_config = DraConfig(
                node=node,
                registry_dir=kubelet_registry_dir,
                plugins_dir=kubelet_plugins_dir,
                cdi_dir=cdi_dir,
                mig=mig_mode,
                mps_pipe_dir=mps_pipe_dir,
                gpus=dra_gpus_set,
                sysfs="" if inventory_file else "/sys",
                dev_root=dev_root,
            )
        config = AgentConfig(
            node=node,
            plugin_dir=device_plugin_dir,
            pod_resources_socket=pod_resources_socket,
            sharing=file_sharing or _sharing(sharing, replicas),
            health_recovery_s=health_recovery_seconds,
            refresh_s=refresh_seconds,
            metrics_address=metrics_address,
            metrics_tls=(
                tls.server_context(
                    tls_cert_file, tls_private_key_file, hosts=[metrics_address.rpartition(":")[0]]
                )
                if metrics_auth == "delegated" or tls_cert_file is not None
                else None
            ),
            mps_pipe_dir=mps_pipe_dir,
            cdi_kind=cdi.kind_for(cdi_devices),
            cdi_dir=cdi_dir if cdi_devices == "kallot" else None,
            dev_root=dev_root,
            dra=dra_config,
            device_plugin=serve_plugin,
            require_mps_daemon=(
                require_mps_daemon if require_mps_daemon is not None else inventory_file is None
            ),
            dcgm_series=dcgm_series,
            mig_reconfigure=mig_reconfigure,
        )
        client = None
        cache = _model_cache_config(
            model_cache, model_manifest, model_read_gbps, model_cache_poll_seconds
        )
        if no_kube and metrics_auth == "delegated":
            raise ConfigError(
                "--metrics-auth", metrics_auth, "none with --no-kube (no API server to ask)"
            )
        if no_kube:
            watcher = models.ModelCacheWatcher(cache, _log_models) if cache else None
            agent = Agent(config, backend, StaticRecordSource(), models=watcher)
        else:
            from kallot.k8sclient.delegated import DelegatedAuth
            from kallot.node.dra_api import ApiClaimSource, SlicePublisher
            from kallot.node.k8s import ApiRecordSource, Events, NodeClient, Publisher
            from kallot.node.migapply import ApiNodeSource

            client = await NodeClient.connect(kubeconfig)
            nvml_mig = (dra and mig_mode == "dynamic") or mig_reconfigure
            agent = Agent(
                config,
                backend,
                ApiRecordSource(client, node),
                publisher=Publisher(client, node),
                events=Events(client, node),
                claims=ApiClaimSource(client) if dra else None,
                slices=SlicePublisher(client, node) if dra else None,
                mig=_nvml_mig() if nvml_mig and not inventory_file else None,
                node_source=ApiNodeSource(client, node) if mig_reconfigure else None,
                models=(
                    models.ModelCacheWatcher(cache, models.ModelCachePublisher(client, node))
                    if cache
                    else None
                ),
                metrics_auth=DelegatedAuth(client) if metrics_auth == "delegated" else None,
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.start()
        logging.getLogger("kallot.agent").info(
            "node %s: %d GPUs, resources %s, metrics on :%d",
            node,
            len(agent.inventory.devices),
            agent.devices.resources(),
            agent.metrics_port,
        )
        try:
            await stop.wait()
        finally:
            await agent.stop()
            backend.close()
            if client is not None:
                await client.close()

    try:
        asyncio.run(main())
    except KallotError as exc:
        typer.echo(f"kallot agent: {exc}", err=True)
        raise typer.Exit(2) from exc


def _model_cache_config(
    roots: list[Path] | None, manifests: list[Path] | None, gbps: float, poll_s: float
) -> models.ModelCacheConfig | None:
    if not roots and not manifests:
        return None
    return models.ModelCacheConfig(
        roots=tuple(roots or ()),
        manifests=tuple(manifests or ()),
        read_bytes_per_s=gbps * 1e9,
        poll_s=poll_s,
    )


async def _log_models(inv: ModelCacheInventory) -> None:
    for line in models.describe(inv):
        logging.getLogger("kallot.agent").info("model cache: %s", line)


def models_cmd(
    model_cache: ModelCacheOpt = None,
    model_manifest: ModelManifestOpt = None,
    model_read_gbps: ModelBandwidthOpt = 0.0,
    output: Annotated[
        str,
        typer.Option(
            "--format",
            click_type=click.Choice(["text", "json"]),
            help="json: the annotation's JSON",
        ),
    ] = "text",
) -> None:
    """Scan the model caches, print what the agent would publish, and exit."""
    as_json = output == "json"
    cache = _model_cache_config(model_cache, model_manifest, model_read_gbps, 0.0)
    if cache is None:
        typer.echo("kallot agent models: give --model-cache DIR or --model-manifest FILE", err=True)
        raise typer.Exit(2)
    found = models.scan(cache)
    bandwidth = 0.0 if cache.read_bytes_per_s else models.measure_read_bandwidth(found.largest)
    inv = models.inventory_of(cache, found, bandwidth)
    if as_json:
        typer.echo(json.dumps(json.loads(inv.to_json()), indent=2))
    else:
        for line in models.describe(inv):
            typer.echo(line)
    if inv.errors:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``kallot agent run|inventory``."""
    agent_app = typer.Typer(
        help="The node agent: NVML discovery, device plugin, GPU metrics.", no_args_is_help=True
    )
    agent_app.command("run")(run_cmd)
    agent_app.command("inventory")(inventory_cmd)
    agent_app.command("metrics")(metrics_cmd)
    agent_app.command("models")(models_cmd)
    app.add_typer(agent_app, name="agent")
