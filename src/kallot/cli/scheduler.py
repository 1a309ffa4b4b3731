"""``kallot scheduler`` (the live scheduler) and ``kallot explain POD``.

Composition root for the kube shell: reads the scheduler configuration (``--config FILE``, or
the shipped file of ``--policy NAME``: config.scheduler), lets the flags given on the command
line override it, builds the registry, framework and core Scheduler explicitly, connects the
client and runs the controller until SIGTERM/SIGINT (graceful: in-flight binds finish, the
lease is released).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer
from click.core import ParameterSource

from kallot.config import presets, tls
from kallot.config import scheduler as scheduler_config
from kallot.config.autoscale import AutoscaleDoc
from kallot.core.errors import KallotError
from kallot.core.scheduler import Scheduler
from kallot.kube import translate
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.app import Controller, ControllerConfig
from kallot.kube.autoscale import disruption
from kallot.kube.autoscale.wiring import loops as autoscale_loops
from kallot.kube.ops import logs
from kallot.kube.ops.sizing import SessionSizing
from kallot.kube.state.cache import CacheTuning

if TYPE_CHECKING:
    from kallot.kube.ops import explain as explain_mod

DEFAULT_POLICY = "kallot"

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"], case_sensitive=False)

KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    ),
]
_SIZING = SessionSizing()  # the defaults of the session-size flags

ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context")]


def scheduler_from(
    config: scheduler_config.SchedulerConfiguration, *, name: str, where: str = "config"
) -> Scheduler:
    """The core Scheduler a configuration describes (``name``: its profile's name in logs)."""
    return Scheduler(presets.framework(config, name=name, where=where))


def build_scheduler(policy: str) -> tuple[str, Scheduler]:
    """The Scheduler of a shipped policy (what ``--policy NAME`` runs)."""
    return policy, scheduler_from(scheduler_config.shipped(policy), name=policy)


def run_scheduler(
    *,
    kubeconfig: Path | None,
    context: str | None,
    scheduler: Scheduler,
    config: ControllerConfig,
    disruption_grace: float | None = disruption.GRACE_S,
    autoscale: AutoscaleDoc | None = None,
) -> int:
    import logging

    log = logging.getLogger("kallot.scheduler")
    log.info(
        "starting policy=%s scheduler_name=%s",
        scheduler.framework.profile.name,
        config.scheduler_name,
    )

    async def main() -> int:
        client = await KubeClient.connect(
            kubeconfig, context=context, pool_size=2 * config.bind_workers + 16
        )
        controller = Controller(client, scheduler, config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, controller.stop)
        guard = None
        if disruption_grace is not None:  # model servers' do-not-disrupt (docs/serving.md)
            guard = asyncio.create_task(
                disruption.DisruptionGuard(
                    client,
                    scheduler_name=config.scheduler_name,
                    grace_s=disruption_grace,
                    wanted=controller.serves_models,
                ).run()
            )
        # Scale-up and consolidation (docs/autoscaling.md): off unless the configuration asks.
        extra = [
            asyncio.create_task(loop)
            for loop in autoscale_loops(
                client,
                controller,
                autoscale or AutoscaleDoc(),
                lambda: scheduler_config.build_framework(scheduler.framework.profile),
                grace_s=disruption_grace if disruption_grace is not None else 0.0,
            )
        ]
        try:
            return await controller.run()
        finally:
            for t in extra:
                t.cancel()
            if guard is not None:
                guard.cancel()
            await client.close()

    return asyncio.run(main())


def controller_config(
    doc: scheduler_config.SchedulerConfiguration, *, identity: str = ""
) -> ControllerConfig:
    """The kube shell's settings of a validated configuration (flags already written onto it:
    config.scheduler.with_flags). Raises KallotError for what only the shell checks (the TLS
    certificate and key files of the secure port)."""
    election, size, queue = doc.leader_election, doc.session_sizing, doc.queue
    plain = scheduler_config.metrics_endpoint(doc.metrics_address)
    secure = scheduler_config.metrics_endpoint(doc.secure_address)
    cert = Path(doc.tls_cert_file) if doc.tls_cert_file else None
    key = Path(doc.tls_private_key_file) if doc.tls_private_key_file else None
    serving_tls = tls.server_context(cert, key, hosts=[secure[0]]) if secure is not None else None
    sizing = SessionSizing(
        target_s=size.target_seconds,
        min_pods=size.min_pods,
        max_pods=size.max_pods,
        max_wall_s=size.max_wall_seconds,
    )
    taints = doc.tolerated_taints
    return ControllerConfig(
        scheduler_name=doc.profile.scheduler_name or translate.SCHEDULER_NAME,
        identity=identity,
        leader_elect=election.leader_elect,
        lease_namespace=election.lease_namespace,
        lease_name=election.lease_name,
        lease_duration_s=election.lease_duration,
        renew_deadline_s=election.renew_deadline,
        retry_period_s=election.retry_period,
        acquire_period_s=election.acquire_period,
        max_clock_skew_s=election.max_clock_skew,
        metrics_host=plain[0] if plain else "127.0.0.1",
        metrics_port=plain[1] if plain else None,
        secure_host=secure[0] if secure else "0.0.0.0",
        secure_port=secure[1] if secure else None,
        tls=serving_tls,
        bind_workers=doc.bind_workers,
        sizing=sizing,
        seed=doc.seed,
        resync_s=doc.resync_seconds,
        scheduled_events=doc.scheduled_events,
        tolerated_taints=(
            frozenset(taints) if taints is not None else translate.DEFAULT_TOLERATED_TAINTS
        ),
        tuning=CacheTuning(
            retry_interval=queue.retry_interval,
            flush_interval=queue.flush_interval,
            backoff_initial=queue.backoff_initial,
            backoff_max=queue.backoff_max,
        ),
        queue_actions=scheduler_config.actions_factory(doc),
    )


def register(app: typer.Typer) -> None:
    """Add ``scheduler`` and ``explain`` to ``app``."""

    @app.command("scheduler")
    def scheduler_cmd(  # noqa: PLR0917 - typer maps parameters to options
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        policy: Annotated[
            str,
            typer.Option(
                click_type=click.Choice(scheduler_config.shipped_names()),
                help="scheduling policy: a shipped configuration file (docs/scheduler-config.md)",
            ),
        ] = DEFAULT_POLICY,
        config_file: Annotated[
            Path | None,
            typer.Option(
                "--config",
                help="a KallotSchedulerConfiguration file (docs/scheduler-config.md); the "
                "flags given on the command line override it",
            ),
        ] = None,
        scheduler_name: Annotated[
            str, typer.Option(help="pods with this spec.schedulerName are scheduled")
        ] = translate.SCHEDULER_NAME,
        leader_elect: Annotated[
            bool, typer.Option(help="elect a leader among replicas with a Lease")
        ] = True,
        lease_namespace: Annotated[
            str, typer.Option(help="namespace of the Lease")
        ] = "kube-system",
        lease_name: Annotated[str, typer.Option(help="name of the Lease")] = "kallot-scheduler",
        lease_duration: Annotated[float, typer.Option(help="seconds a Lease is valid")] = 10.0,
        renew_deadline: Annotated[
            float, typer.Option(help="seconds a leader may fail to renew")
        ] = 7.0,
        retry_period: Annotated[
            float, typer.Option(help="seconds between the leader's Lease renewals")
        ] = 2.0,
        acquire_period: Annotated[
            float, typer.Option(help="seconds between a standby's attempts to take the Lease")
        ] = 1.0,
        max_clock_skew: Annotated[
            float,
            typer.Option(
                help="seconds of clock skew allowed when reading a Lease's renewTime: a Lease "
                "not renewed for lease-duration + this is taken over at once (-1: never trust "
                "renewTime, wait a full lease duration)"
            ),
        ] = 2.0,
        identity: Annotated[str, typer.Option(help="leader identity (default: host_pid)")] = "",
        secure_address: Annotated[
            str,
            typer.Option(
                help="host:port serving /metrics, /healthz, /readyz over TLS; /metrics only to "
                "a bearer token RBAC lets get /metrics (port 0 = any; '' = off)"
            ),
        ] = "0.0.0.0:10259",
        metrics_address: Annotated[
            str,
            typer.Option(
                help="host:port serving the same over plain HTTP without authentication, for "
                "local runs (port 0 = any; '' = off, the default)"
            ),
        ] = "",
        tls_cert_file: Annotated[
            Path | None,
            typer.Option(help="PEM certificate of the secure port (default: self-signed)"),
        ] = None,
        tls_private_key_file: Annotated[
            Path | None, typer.Option(help="PEM private key of --tls-cert-file")
        ] = None,
        bind_workers: Annotated[
            int, typer.Option(help="concurrent bind requests (and as many Event writes)")
        ] = 16,
        session_target: Annotated[
            float,
            typer.Option(
                help="seconds of CPU one session should take: its size follows from the "
                "measured cost per pod (docs/design/003-live-scheduler.md)"
            ),
        ] = _SIZING.target_s,
        min_session_pods: Annotated[
            int, typer.Option(help="pending pods the first session takes, and the least any takes")
        ] = _SIZING.min_pods,
        max_session_pods: Annotated[
            int, typer.Option(help="most pending pods one session takes (0 = no bound)")
        ] = _SIZING.max_pods,
        session_max_wall: Annotated[
            float,
            typer.Option(
                help="seconds of wall time one session should last at most: bounds the time "
                "without a bind when sessions are the limit (0 = no bound)"
            ),
        ] = _SIZING.max_wall_s,
        seed: Annotated[int, typer.Option(min=0, help="seed of the core's tie-breaking")] = 0,
        retry_interval: Annotated[
            float, typer.Option(help="unschedulable pods are retried at most this often (s)")
        ] = 1.0,
        resync: Annotated[
            float, typer.Option(help="full re-list period of every watch (s)")
        ] = 600.0,
        scheduled_events: Annotated[
            bool, typer.Option(help="post a Scheduled event per bind")
        ] = True,
        tolerated_taint: Annotated[
            list[str] | None,
            typer.Option(help="taint keys ignored on every node (repeatable; none by default)"),
        ] = None,
        log_level: Annotated[str, typer.Option(click_type=LOG_LEVELS, help="log level")] = "info",
        log_format: Annotated[
            str, typer.Option(click_type=click.Choice(["text", "json"]), help="log format")
        ] = "text",
        disruption_grace: Annotated[
            float,
            typer.Option(
                help="model servers keep karpenter.sh/do-not-disrupt this long after Ready "
                "(s; negative: never set it)"
            ),
        ] = disruption.GRACE_S,
        check: Annotated[
            bool,
            typer.Option(
                "--check",
                help="validate the configuration (file, policy and flags) as the scheduler "
                "would, print OK or the one thing wrong, and exit without connecting",
            ),
        ] = False,
    ) -> None:
        """Run the live scheduler: binds pods with spec.schedulerName=kallot."""
        logs.configure(log_level, log_format)
        ctx = click.get_current_context()

        def given(param: str) -> bool:
            """Whether the flag was given on the command line (else the file's value)."""
            source = ctx.get_parameter_source(param)
            return source in {ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT}

        if config_file is not None and given("policy"):
            raise typer.BadParameter(
                "pass --policy or --config, not both (the file names the plugins)",
                param_hint="--policy",
            )
        values = ctx.params
        flags = {
            flag: values[flag.removeprefix("--").replace("-", "_")]
            for flag in scheduler_config.FLAG_FIELDS
            if given(flag.removeprefix("--").replace("-", "_"))
        }
        try:
            if config_file is not None:
                where = config_file.name
                doc = scheduler_config.load(config_file)
                name = config_file.stem
            else:
                where = f"{policy}.yaml"
                doc = scheduler_config.shipped(policy)
                name = policy
            doc = scheduler_config.with_flags(doc, flags, where=where)
            scheduler = scheduler_from(doc, name=name, where=where)
            config = controller_config(doc, identity=identity)
        except KallotError as exc:
            typer.echo(f"kallot scheduler: {' '.join(str(exc).split())}", err=True)
            raise typer.Exit(2) from None
        if check:
            ports = [
                f"{what} {host}:{port}"
                for what, host, port in (
                    ("secure", config.secure_host, config.secure_port),
                    ("plain", config.metrics_host, config.metrics_port),
                )
                if port is not None
            ]
            typer.echo(
                f"kallot scheduler: {where}: OK (profile {scheduler.framework.profile.name}, "
                f"schedulerName {config.scheduler_name}, metrics on "
                f"{', '.join(ports) or 'no port'}); not connecting (--check)"
            )
            raise typer.Exit(0)
        grace = doc.disruption_grace_seconds
        try:
            code = run_scheduler(
                kubeconfig=kubeconfig,
                context=context,
                scheduler=scheduler,
                config=config,
                disruption_grace=grace if grace >= 0 else None,
                autoscale=doc.autoscale,
            )
        except KallotError as exc:
            typer.echo(f"kallot scheduler: {exc}", err=True)
            raise typer.Exit(2) from exc
        raise typer.Exit(code)

    app.command("explain")(explain_cmd)


def explain_cmd(
    pod: Annotated[str, typer.Argument(help="pod name, or namespace/name")],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="namespace")] = "",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    scheduler_name: Annotated[
        str, typer.Option(help="kallot's schedulerName")
    ] = translate.SCHEDULER_NAME,
) -> None:
    """Why is POD pending, or which GPUs did it get."""
    from rich.console import Console  # not on `kallot scheduler`'s start-up path

    from kallot.kube.ops import explain as explain_mod

    ns, _, name = pod.rpartition("/")
    ns = ns or namespace or _current_namespace(kubeconfig, context)

    async def main() -> explain_mod.Explanation:
        client = await KubeClient.connect(kubeconfig, context=context, pool_size=4)
        try:
            return await explain_mod.fetch(client, ns, name, scheduler_name=scheduler_name)
        finally:
            await client.close()

    console = Console(highlight=False, soft_wrap=True)
    try:
        result = asyncio.run(main())
    except ApiError as exc:
        if exc.not_found:
            typer.echo(f"kallot explain: pod {ns}/{name} not found", err=True)
        else:
            typer.echo(f"kallot explain: {exc}", err=True)
        raise typer.Exit(1) from exc
    except KallotError as exc:
        typer.echo(f"kallot explain: {exc}", err=True)
        raise typer.Exit(2) from exc
    style = {"bound": "green", "pending": "yellow", "invalid": "red"}.get(result.status, "")
    lines = result.lines()
    console.print(lines[0], style=style or None, markup=False)
    for line in lines[1:]:
        console.print(line, markup=False)


def _current_namespace(kubeconfig: Path | None, context: str | None) -> str:
    """The kubeconfig context's namespace, as kubectl uses it (default 'default')."""
    import os

    import yaml

    path = (
        kubeconfig
        or Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    )
    # ValueError: a kubeconfig that is not UTF-8 text; the client's own load reports it.
    with contextlib.suppress(OSError, ValueError, yaml.YAMLError, AttributeError, TypeError):
        doc = yaml.safe_load(Path(path).read_text())
        name = context or doc.get("current-context")
        for ctx in doc.get("contexts") or []:
            if ctx.get("name") == name:
                return str((ctx.get("context") or {}).get("namespace") or "default")
    ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if ns_file.is_file():
        return ns_file.read_text().strip()
    return "default"
