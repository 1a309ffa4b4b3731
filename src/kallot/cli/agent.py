"""``kallot agent``: the node agent (DaemonSet). ``run`` serves the device plugin, health, the
exporter and publishing; ``inventory`` prints what discovery finds and exits.

Composition root for the node shell: picks the backend (NVML, or the fake backend with
``--inventory-file FILE``), the record source (the API server, or none with ``--no-kube``) and
runs ``kallot.node.agent.Agent`` until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from pathlib import Path
from typing import Annotated, Literal

import click
import typer

from kallot.core.errors import KallotError
from kallot.node.discovery import Backend, Sharing, build_inventory, gfd_labels

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


def _backend(inventory_file: Path | None) -> tuple[Backend, Sharing | None]:
    if inventory_file is not None:
        from kallot.node.fake import FakeBackend

        fake = FakeBackend.from_file(inventory_file)
        return fake, fake.sharing()
    from kallot.node.nvml import NvmlBackend

    return NvmlBackend(), None


def _sharing(mode: str, replicas: int) -> Sharing:
    if mode not in ("exclusive", "time-slicing", "mps"):
        raise typer.BadParameter(
            f"got {mode!r}, expected exclusive, time-slicing or mps", param_hint="--sharing"
        )
    m: Literal["exclusive", "time-slicing", "mps"] = mode  # type: ignore[assignment]
    return Sharing(mode=m, replicas=replicas)


def inventory_cmd(
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
) -> None:
    """Discover this node's GPUs, print the inventory the agent would publish, and exit."""
    as_json = output == "json"
    try:
        backend, file_sharing = _backend(inventory_file)
        try:
            inv = build_inventory(backend.raw(), file_sharing or _sharing(sharing, replicas))
        finally:
            backend.close()
    except KallotError as exc:
        typer.echo(f"kallot agent inventory: {exc}", err=True)
        raise typer.Exit(2) from exc
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
            inv = build_inventory(backend.raw(), file_sharing or _sharing(sharing, replicas))
            state = ExporterState(node=node_name or socket.gethostname(), inventory=inv)
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
) -> None:
    """Run the node agent: device plugin, health, exporter, publishing."""
    if not device_plugin_dir.is_dir():
        typer.echo(
            f"kallot agent: --device-plugin-dir: got '{device_plugin_dir}', expected the "
            "kubelet's device plugin directory (an existing directory: is this a Kubernetes node, "
            "and is the hostPath mounted?)",
            err=True,
        )
        raise typer.Exit(2)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from kallot.node.agent import Agent, AgentConfig
    from kallot.node.deviceplugin import StaticRecordSource

    node = node_name or socket.gethostname()

    async def main() -> None:
        backend, file_sharing = _backend(inventory_file)
        config = AgentConfig(
            node=node,
            plugin_dir=device_plugin_dir,
            pod_resources_socket=pod_resources_socket,
            sharing=file_sharing or _sharing(sharing, replicas),
            health_recovery_s=health_recovery_seconds,
            refresh_s=refresh_seconds,
            metrics_address=metrics_address,
            mps_pipe_dir=mps_pipe_dir,
            require_mps_daemon=(
                require_mps_daemon if require_mps_daemon is not None else inventory_file is None
            ),
        )
        client = None
        if no_kube:
            agent = Agent(config, backend, StaticRecordSource())
        else:
            from kallot.node.k8s import ApiRecordSource, Events, NodeClient, Publisher

            client = await NodeClient.connect(kubeconfig)
            agent = Agent(
                config,
                backend,
                ApiRecordSource(client, node),
                publisher=Publisher(client, node),
                events=Events(client, node),
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


def register(app: typer.Typer) -> None:
    """Add ``kallot agent run|inventory``."""
    agent_app = typer.Typer(
        help="The node agent: NVML discovery, device plugin, GPU metrics.", no_args_is_help=True
    )
    agent_app.command("run")(run_cmd)
    agent_app.command("inventory")(inventory_cmd)
    agent_app.command("metrics")(metrics_cmd)
    app.add_typer(agent_app, name="agent")
